"""Project-level checks: the settings page, packaging, the test layout (docker-compose.yml and the Dockerfile:
tests/deploy/test_image_and_compose.py)."""
from __future__ import annotations

import re
import tomllib
from collections import Counter
from pathlib import Path

from cachesvc import config

ROOT = Path(__file__).resolve().parent.parent


def test_settings_page_documents_every_setting_and_no_other():
    table = (ROOT / "docs" / "settings.md").read_text()
    documented = set(re.findall(r"^\| `CACHESVC_([A-Z0-9_]+)`", table, re.M))
    assert documented == set(config.SETTINGS)


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
