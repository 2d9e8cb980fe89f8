"""Project-level checks: the settings page, the dependencies, the test layout (the wheel and the sdist:
tests/test_wheel.py; docker-compose.yml and the Dockerfile: tests/deploy/test_image_and_compose.py)."""
from __future__ import annotations

import importlib.util
import re
import tomllib
from collections import Counter
from pathlib import Path

from cachesvc import config

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_settings_page_is_what_the_script_generates_from_config():
    settings_doc = _script("settings_doc")
    current = settings_doc.PAGE.read_text()
    assert settings_doc.page(current) == current, "docs/settings.md is stale: run python scripts/settings_doc.py"
    generated = settings_doc.table()
    assert set(re.findall(r"^\| `CACHESVC_([A-Z0-9_]+)`", generated, re.M)) == set(config.SETTINGS)
    assert "`sqlite:///<DATA_DIR>/cachesvc.db`" in generated and "Takes a size" in generated
    stale = current.replace(generated, generated.replace("`3600`", "`7200`"))
    assert settings_doc.page(stale) == current, "the script rewrites a hand-edited table"


def test_client_settings_table_names_every_variable_the_client_reads():
    """Hand-kept (the client's variables are read where they are used), so checked against the source:
    every CACHESVC_* name in client/ (CACHESVC_ENV_<field> as one row) and TORCHINDUCTOR_CACHE_DIR."""
    from cachesvc_client.shared.keys import ENV_FIELDS

    page = (ROOT / "docs" / "settings.md").read_text()
    client_part = page[page.index("## Client side"):]
    documented = set(re.findall(r"^\| `([A-Z0-9_<>]+)`", client_part, re.M))
    read = set()
    for path in (ROOT / "client").rglob("*.py"):
        for name in re.findall(r"\b(CACHESVC_[A-Z0-9_]*[A-Z0-9]_?)", path.read_text()):
            env_field = name.startswith("CACHESVC_ENV_") and (
                name == "CACHESVC_ENV_" or name[len("CACHESVC_ENV_"):].lower() in ENV_FIELDS)
            read.add("CACHESVC_ENV_<FIELD>" if env_field else name)
    read.add("TORCHINDUCTOR_CACHE_DIR")
    assert documented == read, f"missing: {sorted(read - documented)}, not read: {sorted(documented - read)}"


def test_client_install_needs_none_of_the_server_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client_deps = " ".join(project["dependencies"]).lower()
    for server_only in ("flask", "sqlalchemy", "alembic", "boto3", "psycopg", "torch"):
        assert server_only not in client_deps
    assert any("flask" in d for d in project["optional-dependencies"]["server"])


def test_test_files_have_unique_basenames():
    """pytest imports tests/ folders without __init__.py by basename: two test files of one name break
    collection of the whole suite (it happened once when two branches met)."""
    names = Counter(p.name for p in Path(__file__).parent.rglob("test_*.py"))
    assert not [n for n, c in names.items() if c > 1]
