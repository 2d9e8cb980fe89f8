"""The Alembic migrations are the schema: they match the models, and the app refuses a schema behind them.

The other tests get copies of one database migrated per run (tests/conftest.py); here the migrations
run from an empty database, on SQLite and PostgreSQL, as `cachesvc db upgrade` runs them."""
from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

import cachesvc
from cachesvc import db
from cachesvc.models import Base


def test_migrations_from_an_empty_database_match_the_models(empty_database_url):
    db.upgrade(empty_database_url)
    engine = create_engine(empty_database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], diff


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_downgrade_to_the_first_revision_and_up_again(database_url):
    command.downgrade(db.alembic_config(database_url), "0001")
    engine = create_engine(database_url)
    try:
        assert "tokens" not in inspect(engine).get_table_names()
        assert db.schema_status(engine) == ("0001", db.schema_status(engine)[1])
    finally:
        engine.dispose()
    db.upgrade(database_url)
    engine = create_engine(database_url)
    try:
        assert {"tokens", "audit_log"} <= set(inspect(engine).get_table_names())
        assert "purged_at" in {c["name"] for c in inspect(engine).get_columns("versions")}
    finally:
        engine.dispose()


def test_create_app_refuses_a_schema_behind_the_code(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    db.upgrade(url, "0001")
    with pytest.raises(SystemExit) as exc:
        cachesvc.create_app({"DATABASE_URL": url, "DATA_DIR": str(tmp_path)})
    message = str(exc.value)
    assert "cachesvc db upgrade" in message and "0001" in message
    with pytest.raises(SystemExit) as exc:
        cachesvc.create_app({"DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}", "DATA_DIR": str(tmp_path)})
    assert "cachesvc db upgrade" in str(exc.value)
