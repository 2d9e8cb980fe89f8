"""`cachesvc serve`: the app under gunicorn, with a run folder of its own.

Every serve makes a fresh folder (``tempfile.mkdtemp`` in TMPDIR, named after its pid) for

* prometheus_client's multiprocess files (``metrics/``): each worker writes its own, /metrics
  sums them; ``PROMETHEUS_MULTIPROC_DIR`` set by the caller wins (and is left alone);
* gunicorn's control socket (``gunicorn.ctl``, for ``gunicornc -s <path>``), where the
  installed gunicorn has one (25.1 and later) and the path fits a Unix socket;

and removes it when it stops. So services on one host never share, count or delete each
other's files (they did: one shared metrics folder per data dir, one control socket per user).
A serve killed with SIGKILL leaves its folder behind in TMPDIR.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import click

from .failures import Failure
from .proxy import SOCKET_PATH_MAX, drain_unread_bodies, nginx_front
from ..config import Settings



@contextlib.contextmanager
def run_folder() -> Iterator[Path]:
    """This serve's own folder, removed on the way out by the process that made it (gunicorn's
    workers are forked inside ``run()`` and leave through here too)."""
    owner = os.getpid()
    path = Path(tempfile.mkdtemp(prefix=f"cachesvc-serve-{owner}-"))
    try:
        yield path
    finally:
        if os.getpid() == owner:
            shutil.rmtree(path, ignore_errors=True)


def _metrics_dir(run: Path) -> None:
    """Must happen before prometheus_client is imported (it picks its value class then)."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        (run / "metrics").mkdir()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(run / "metrics")


def serve(settings: Settings, *, host: str, port: int, workers: int, threads: int) -> None:
    """Migrate where AUTO_MIGRATE says so, then run gunicorn (behind nginx with SERVE_PROXY) until it is
    stopped."""
    from .. import config, db

    config.check_production(settings)  # before a migration or a bound port
    if settings.AUTO_MIGRATE:
        db.upgrade(settings.DATABASE_URL)
    with run_folder() as run:
        _metrics_dir(run)
        from ..app import create_app

        try:
            app = create_app()
        except ValueError as exc:  # from_url: a storage URL of an unknown scheme
            raise Failure(f"CACHESVC_STORAGE_URL: {exc}") from None
        # create_app checked the schema over a pooled connection: forked workers must not inherit it
        # (two processes on one socket corrupt each other's replies: 8 concurrent publishes got 500s).
        app.extensions["cachesvc"].db.engine.dispose()
        control = run / "gunicorn.ctl"
        with contextlib.ExitStack() as stack:
            bind = (stack.enter_context(nginx_front(run, host, port, app)) if settings.SERVE_PROXY
                    else f"{host}:{port}")
            _gunicorn(app, settings, bind, workers, threads, control, f"http://{host}:{port}", run)


def _gunicorn(app, settings: Settings, bind: str, workers: int, threads: int, control: Path, url: str, run: Path) -> None:
    """Run gunicorn on ``bind`` until it is stopped."""
    from gunicorn.app.base import BaseApplication

    from .direct import safe_url

    def child_exit(_server, worker):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)

    class _Server(BaseApplication):
        def load_config(self):
            for name, value in (("bind", bind), ("workers", workers), ("threads", threads),
                                ("timeout", 300), ("accesslog", "-"), ("child_exit", child_exit),
                                ("post_fork", lambda _s, _w: app.extensions["cachesvc_scheduler"].ensure_started())):
                self.cfg.set(name, value)
            if "control_socket" in self.cfg.settings:  # gunicorn >= 25.1: one of our own, or none
                if len(str(control)) <= SOCKET_PATH_MAX:
                    self.cfg.set("control_socket", str(control))
                else:
                    self.cfg.set("control_socket_disable", True)

        def load(self):
            return drain_unread_bodies(app) if bind.startswith("unix:") else app  # behind nginx

    server = _Server()
    front = " (nginx in front)" if bind.startswith("unix:") else ""
    click.echo(f"cachesvc on {url}{front}  database={safe_url(settings.DATABASE_URL)}  "
               f"storage={settings.STORAGE_URL}  run folder={run}", err=True)
    server.run()
