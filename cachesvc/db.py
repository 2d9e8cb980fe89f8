"""Engine, session scope and the schema-revision check.

``Database.session()`` is the one place a unit of work commits or rolls back.
Connection failures surface as SQLAlchemy ``OperationalError`` and the error
handler in ``errors.py`` turns them into 503s.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Optional

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    engine = create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)

    @event.listens_for(engine, "handle_error")
    def _failed_ping_means_gone(ctx):
        # After a database restart psycopg can fail the pre-ping itself with a ProgrammingError
        # ("can't change 'autocommit' now"), which SQLAlchemy does not count as a disconnect
        # and raises (a 500). Any failed ping means the pooled connection is dead: drop it and
        # connect afresh (tests/reliability: the database restarted under load).
        if ctx.is_pre_ping:
            ctx.is_disconnect = True

    return engine


def alembic_config(url: str) -> Config:
    from . import migrations  # the top-level migrations/ folder, packaged as cachesvc.migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the schema to ``revision`` (what `cachesvc db upgrade` runs)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def schema_status(engine: Engine) -> tuple[Optional[str], str]:
    """Return (current revision in the database, head revision of the code)."""
    head = ScriptDirectory.from_config(alembic_config(str(engine.url))).get_current_head()
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    return current, head


class Database:
    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        self._factory = sessionmaker(self.engine, expire_on_commit=False)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """A unit of work: commits on success, rolls back on any exception."""
        s = self._factory()
        try:
            yield s
            s.commit()
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    def check_schema(self) -> None:
        current, head = schema_status(self.engine)
        if current != head:
            raise SystemExit(
                f"database schema is at revision {current or 'none'}, the code needs {head}: "
                f"run `cachesvc db upgrade` (CACHESVC_DATABASE_URL={self.engine.url.render_as_string(hide_password=True)})"
            )
