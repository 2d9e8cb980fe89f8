"""Project-level checks: docker-compose.yml, the Dockerfile, the settings page, packaging."""
from __future__ import annotations

import re
import tomllib
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

import yaml

from cachesvc import config
from cachesvc.storage import from_url
from cachesvc.storage.s3 import S3Storage

ROOT = Path(__file__).resolve().parent.parent


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_has_postgres_minio_with_its_bucket_and_the_service():
    services = compose()["services"]
    assert {"postgres", "minio", "minio-bucket", "cachesvc"} <= set(services)
    svc = services["cachesvc"]
    assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert svc["depends_on"]["minio-bucket"]["condition"] == "service_completed_successfully"


def test_compose_service_settings_are_documented_settings_that_agree_with_the_other_services():
    services = compose()["services"]
    env = services["cachesvc"]["environment"]
    names = {k[len("CACHESVC_"):] for k in env if k.startswith("CACHESVC_")}
    assert names <= set(config.SETTINGS), names - set(config.SETTINGS)

    db = urlparse(env["CACHESVC_DATABASE_URL"])
    pg = services["postgres"]["environment"]
    assert (db.username, db.password, db.hostname, db.path.lstrip("/")) == (
        pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], "postgres", pg["POSTGRES_DB"])

    minio = services["minio"]["environment"]
    assert env["CACHESVC_S3_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"]
    assert env["CACHESVC_S3_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"]
    assert urlparse(env["CACHESVC_S3_ENDPOINT_URL"]).hostname == "minio"
    bucket = urlparse(env["CACHESVC_STORAGE_URL"]).netloc
    assert f"local/{bucket}" in services["minio-bucket"]["entrypoint"]

    settings = config.load({}, environ={k: str(v) for k, v in env.items()})
    assert settings["AUTO_MIGRATE"] is False  # PostgreSQL: migrations run by the image's command
    assert isinstance(from_url(settings["STORAGE_URL"], settings), S3Storage)


def test_dockerfile_migrates_then_runs_the_app_factory_under_gunicorn():
    text = (ROOT / "Dockerfile").read_text()
    cmd = text[text.index("CMD"):]
    assert cmd.index("cachesvc db upgrade") < cmd.index("gunicorn")
    assert "'cachesvc.app:create_app()'" in cmd
    from cachesvc.app import create_app  # the target gunicorn imports

    assert callable(create_app)


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
