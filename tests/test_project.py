"""Project-level checks: the settings page, the dependencies, the test layout (the wheel and the sdist:
tests/test_wheel.py; docker-compose.yml and the Dockerfile: tests/deploy/test_image_and_compose.py)."""
from __future__ import annotations

import ast
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


def _test_modules_imported(path: Path, tests: Path) -> set:
    """The test modules (``test_*``) and conftests the file at ``path`` (under the folder ``tests``) imports,
    anywhere in it (function bodies too), relative imports resolved against its folder:
    ``from tests.x.test_y import z``, ``from .test_y import z``, ``import tests.conftest``,
    ``from tests.reliability import conftest``."""
    package = ["tests", *path.parent.relative_to(tests).parts]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - (node.level - 1)] + ([node.module] if node.module else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in ("tests", "conftest")
                     and any(part.startswith("test_") or part == "conftest" for part in n.split(".")))
    return found


def test_no_test_file_imports_another_test_file_or_a_conftest(tmp_path):
    """Issue 40: pytest imports a test file (and a conftest) by its own name, so ``from tests.x.test_y import z``
    runs test_y a second time as another module, and ties a test file to another's internals (a conftest's
    fixtures reach their folder by themselves). Helpers shared by test files are in tests/helpers/ (or other
    modules not named test_*); shared fixtures in a conftest of a common folder."""
    probe = tmp_path / "tests" / "reliability" / "test_probe.py"  # the reading, on known imports
    probe.parent.mkdir(parents=True)
    probe.write_text("from tests.reliability.conftest import x\nfrom .test_faults import y\nfrom . import helper\n"
                     "def f():\n    import tests.client.test_frames\n    from tests.helpers.client import z\n")
    assert _test_modules_imported(probe, tmp_path / "tests") == {
        "tests.reliability.conftest", "tests.reliability.conftest.x", "tests.reliability.test_faults",
        "tests.reliability.test_faults.y", "tests.client.test_frames"}
    tests = ROOT / "tests"
    found = {str(p.relative_to(ROOT)): sorted(_test_modules_imported(p, tests))
             for p in sorted(tests.rglob("test_*.py"))}
    assert {p: names for p, names in found.items() if names} == {}
