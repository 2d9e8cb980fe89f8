"""Scheduled eviction inside the service: LRU by last restore to a byte budget, then GC.

With ``GC_INTERVAL_SECONDS`` > 0 every service process runs a daemon thread
that, every interval, tries to become *the* runner: a PostgreSQL session
advisory lock (``pg_try_advisory_lock``) or, on SQLite, a file lock beside
the database file, taken without waiting. The process that gets it

1. purges, when ``LRU_BUDGET_BYTES`` > 0, the least recently restored
   committed versions until the stored bytes of the rest fit the budget
   (``collect.purge`` with ``max_total_bytes``: a version's last restore, or
   its creation when never restored, orders them);
2. runs ``collect.gc``, which deletes a purged version's blobs only after
   ``GC_GRACE_SECONDS``, so restores that resolved it before the purge finish;
3. deletes events and audit records past ``EVENTS_RETENTION_DAYS`` and
   ``AUDIT_RETENTION_DAYS``, and ended page sessions (``retention``);

through the admin actions (``cachesvc.lifecycle.actions``, as an admin's purge does), which write the
``purge``/``gc`` audit records, with the actor ``scheduler``. The
others skip that round, so two processes never evict at once (and the store
lock still serialises each step against publishes and admin purges).

The thread starts in each process on its first request (``ensure_started``,
a ``before_request`` hook) and, under ``cachesvc serve``, right after
gunicorn forks a worker; never before a fork (a thread and pooled database
connections do not survive one).
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Iterator, Optional

from filelock import FileLock, Timeout
from sqlalchemy import text
from sqlalchemy.engine import make_url

from . import actions, retention

log = logging.getLogger(__name__)

_RUNNER_KEY = 0x63617363  # advisory-lock key of the scheduled runner ("casc"), not the store lock
ACTOR = "scheduler"


class Scheduler:
    """One per app (``app.extensions["cachesvc_scheduler"]``); thread-safe."""

    def __init__(self, services):
        self.svc = services
        self.interval = float(services.settings.GC_INTERVAL_SECONDS or 0)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._pid: Optional[int] = None
        self._guard = threading.Lock()

    @contextlib.contextmanager
    def _runner_lock(self) -> Iterator[bool]:
        """Yields whether this process holds the runner lock (taken without waiting)."""
        engine = self.svc.db.engine
        if engine.dialect.name == "postgresql":
            with engine.connect() as conn:
                got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _RUNNER_KEY}).scalar()
                conn.commit()
                try:
                    yield bool(got)
                finally:
                    if got:
                        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _RUNNER_KEY})
                        conn.commit()
            return
        path = make_url(self.svc.settings.DATABASE_URL).database or os.path.join(self.svc.settings.DATA_DIR, "db")
        lock = FileLock(f"{path}.scheduler.lock")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            yield False
            return
        try:
            yield True
        finally:
            lock.release()

    def run_once(self) -> Optional[dict]:
        """One round: evict to the budget, GC, then retention. None when another process holds the runner lock."""
        settings = self.svc.settings
        with self._runner_lock() as mine:
            if not mine:
                return None
            budget = int(settings.LRU_BUDGET_BYTES or 0)
            if budget <= 0:
                result = {"purge": None, "gc": actions.gc(self.svc, actor=ACTOR)}
            else:
                purged = actions.purge(self.svc, {"max_total_bytes": budget}, actor=ACTOR)
                result = {"purge": {"version_count": purged["version_count"], "bytes_freed": purged["bytes_freed"],
                                    "versions": [v["id"] for v in purged["versions"]]},
                          "gc": purged["gc"]}
            result["retention"] = retention.apply(self.svc)
            return result

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                result = self.run_once()
                if result and result["purge"] and result["purge"]["version_count"]:
                    log.info("scheduled eviction purged %d version(s); gc freed %d bytes",
                             result["purge"]["version_count"], result["gc"]["bytes_freed"])
            except Exception:  # keep the schedule alive; the next round retries
                log.exception("scheduled eviction/GC failed; retrying in %.0f s", self.interval)

    def ensure_started(self) -> None:
        """Start the thread in this process if the schedule is on and it is not running here yet."""
        if self.interval <= 0 or self._pid == os.getpid():
            return
        with self._guard:
            if self._pid == os.getpid():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="cachesvc-scheduler", daemon=True)
            self._thread.start()
            self._pid = os.getpid()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the thread (after the round in progress, if any)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._pid = None
