"""Engine, session scope and the schema-revision check.

``Database.session()`` is the one place a unit of work commits or rolls back.
Connection failures surface as SQLAlchemy ``OperationalError`` and the error
handler in ``errors.py`` turns them into 503s.

An SQLite database file (and its folder, ``./cachesvc-data`` by default) is
made in one place: ``make_engine(url, create=True)``, which the migrations
use (``upgrade``: `cachesvc db upgrade`, and `cachesvc serve` on SQLite).
Everything else opens an existing file only, so a mistyped URL is reported
(``DatabaseNotReady``) instead of leaving an empty database behind.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Optional

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker


class DatabaseNotReady(SystemExit):
    """The database cannot serve this code yet: no SQLite file, or a schema behind the code.

    A SystemExit, so a server that imports the app (gunicorn) stops with the message alone;
    the message says what to run.
    """


def sqlite_path(url: str) -> Optional[Path]:
    """The file of an SQLite URL; None for other databases and in-memory SQLite."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    path = parsed.database
    return Path(path[len("file:"):] if path.startswith("file:") else path)


def exists(url: str) -> bool:
    """False only for an SQLite file that is not there (other databases are assumed to exist)."""
    path = sqlite_path(url)
    return path is None or path.exists()


def make_engine(url: str, *, create: bool = False) -> Engine:
    """An engine for ``url``. An SQLite file is made (folders included) only with ``create``;
    without it a missing file raises DatabaseNotReady."""
    if make_url(url).get_backend_name() == "sqlite":
        path = sqlite_path(url)
        if path is not None and create:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif path is not None and not path.exists():
            raise DatabaseNotReady(
                f"no database at {path.resolve()}: run `cachesvc db upgrade` to create it (`cachesvc serve` "
                f"does unless CACHESVC_AUTO_MIGRATE is off), or check CACHESVC_DATA_DIR / CACHESVC_DATABASE_URL")
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


class UnknownRevision(ValueError):
    """``upgrade`` was asked for a revision the migrations do not have or cannot reach."""


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the schema to ``revision`` (what `cachesvc db upgrade` runs), making an SQLite file
    and its folder when there is none (migrations/env.py opens it with ``make_engine(create=True)``).
    Raises UnknownRevision for a revision that is not in the migrations."""
    from alembic import command
    from alembic.util import CommandError

    try:
        command.upgrade(alembic_config(url), revision)
    except CommandError as exc:  # "Can't locate revision ...", "... is not a valid upgrade target ..."
        raise UnknownRevision(str(exc)) from None


def head_revision() -> str:
    """The newest revision of the migrations."""
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def schema_status(engine: Engine) -> tuple[Optional[str], str]:
    """Return (current revision in the database, head revision of the code)."""
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    return current, head_revision()


class Database:
    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        from . import rollups

        rollups.install()  # every event written through a session also adds itself to the stats' totals
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
            raise DatabaseNotReady(
                f"database schema is at revision {current or 'none'}, the code needs {head}: "
                f"run `cachesvc db upgrade` (CACHESVC_DATABASE_URL={self.engine.url.render_as_string(hide_password=True)})"
            )
