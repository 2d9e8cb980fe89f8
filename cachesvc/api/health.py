"""Liveness (``/healthz``: the database answers) and readiness (``/readyz``: the database and the blob
storage answer).

Liveness stays one ``SELECT 1``: a storage outage takes pods out of the Service (readiness) but does
not restart them all. Readiness asks the storage for one cheap real call (``Storage.check``), in a
thread of its own bounded by ``STORAGE_DEADLINE``: a hung S3 answers 503 naming the storage within
the probe's timeout, and one check at most is in flight per process, however many probes come.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from typing import Optional

from flask import current_app
from sqlalchemy import text

from ..errors import Unavailable
from ..auth import requires
from .answers import HealthSchema
from ..services import services
from . import Blueprint

blp = Blueprint("health", __name__, description="Health and readiness checks")

#: seconds readiness waits for the storage: under the readiness probe's 3 s (deploy/kubernetes/base)
STORAGE_DEADLINE = 2.0


class StorageCheck:
    """``Storage.check`` run in a daemon thread, one at a time: a probe that finds one still running
    waits on that one (a hung store holds one thread, not one per probe). Thread-safe."""

    def __init__(self, storage):  # the service's Storage; only its check() is called (views import no storage)
        self.storage = storage
        self._lock = threading.Lock()
        self._pending: Optional[Future] = None
        self._since = 0.0

    def _run(self, future: Future) -> None:
        try:
            self.storage.check()
        except BaseException as exc:  # noqa: BLE001 - handed to the probe, which names it
            future.set_exception(exc)
        else:
            future.set_result(None)

    def problem(self, deadline: float = STORAGE_DEADLINE) -> Optional[str]:
        """None when the storage answered within ``deadline`` seconds, else what went wrong."""
        with self._lock:
            if self._pending is None or self._pending.done():
                self._pending, self._since = Future(), time.monotonic()
                threading.Thread(target=self._run, args=(self._pending,), name="cachesvc-storage-check",
                                 daemon=True).start()
            pending, since = self._pending, self._since
        try:
            pending.result(timeout=deadline)
        except FutureTimeout:
            return (f"storage did not answer within {deadline:g} s (its check has been waiting "
                    f"{time.monotonic() - since:.0f} s)")
        except Exception as exc:  # noqa: BLE001 - any failure of the store means not ready
            return f"storage unreachable: {exc}"
        return None


def _database_problem() -> Optional[str]:
    try:
        with services().db.session() as s:
            s.execute(text("SELECT 1"))
    except Exception as exc:  # any failure to reach the database means not ready
        return f"database unreachable: {type(exc).__name__}"
    return None


@blp.route("/healthz", methods=["GET"])
@requires(None)
@blp.response(200, HealthSchema)
def healthz():
    """Liveness: 200 when the database answers; 503 otherwise. Never asks the storage."""
    problem = _database_problem()
    if problem:
        raise Unavailable(problem, {"failed": ["database"]})
    return {"status": "ok", "version": services().version}


@blp.route("/readyz", methods=["GET"])
@requires(None)
@blp.response(200, HealthSchema)
def readyz():
    """Readiness: 200 when the database and the blob storage answer; 503 naming each that does not
    (``details.failed``). The storage gets ``STORAGE_DEADLINE`` seconds."""
    svc = services()
    check = current_app.extensions.get("cachesvc_storage_check")
    if check is None or check.storage is not svc.storage:
        check = current_app.extensions["cachesvc_storage_check"] = StorageCheck(svc.storage)
    problems = {"database": _database_problem(), "storage": check.problem()}
    failed = [name for name, problem in problems.items() if problem]
    if failed:
        raise Unavailable("; ".join(problems[name] for name in failed), {"failed": failed})
    return {"status": "ok", "version": svc.version}
