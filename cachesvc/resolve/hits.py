"""Restore counters kept in memory and written every few seconds.

A resolve that hits must not write in the request: an UPDATE of the entry, one
of the version, an INSERT and a COMMIT per hit were most of a resolve's time
under load. ``HitLog.record`` adds the hit to in-process tallies; ``flush``
writes them in one transaction, in id order (so two workers flushing at once
cannot deadlock):

    entries, versions:  restore_count += n, last_restored_at = max(old, newest hit)
    events:             one ``hit`` row per hit: a restore of the exact key (``cachesvc.readmodel.stats``)

A daemon thread flushes every ``HIT_FLUSH_SECONDS`` and ``close()`` flushes
once more; it runs at interpreter exit too, which is how gunicorn workers end.
So the counters the browse pages, purge-by-last-use and an LRU policy read are
at most that many seconds behind per serving process. A process killed with
SIGKILL loses its last interval's tallies: they are statistics, and nothing
that decides whether a blob may be deleted reads them (see ``collect``).
``HIT_FLUSH_SECONDS`` 0 writes every hit at once (what the tests' app uses).

Thread-safe. A failed flush keeps its tallies for the next one and logs why.
"""
from __future__ import annotations

import atexit
import datetime as dt
import logging
import os
import threading
import weakref
from typing import Dict, Iterable, List, Optional, Tuple

from sqlalchemy import bindparam, case, insert, or_, update

from ..db import Database
from .. import rollups
from ..models import Entry, Event, Version, utcnow

log = logging.getLogger(__name__)

Tally = Dict[int, Tuple[int, dt.datetime]]  # id -> (hits, newest hit)


def _bump(conn, model, tally: Tally) -> None:
    if not tally:
        return
    t = model.__table__
    at = bindparam("b_at", type_=t.c.last_restored_at.type)
    newer = or_(t.c.last_restored_at.is_(None), t.c.last_restored_at < at)
    stmt = (update(t).where(t.c.id == bindparam("b_id"))
            .values(restore_count=t.c.restore_count + bindparam("b_n"),
                    last_restored_at=case((newer, at), else_=t.c.last_restored_at)))
    conn.execute(stmt, [{"b_id": i, "b_n": n, "b_at": when} for i, (n, when) in sorted(tally.items())])


def _write(conn, entries: Tally, versions: Tally, events: List[dict]) -> None:
    _bump(conn, Entry, entries)
    _bump(conn, Version, versions)
    if events:
        conn.execute(insert(Event.__table__), events)
        rollups.add(conn, events)  # a core insert: the ORM's flush hook does not see these


def write_now(session, restores: Iterable[Tuple[int, int, int, Optional[float]]], kind: str = "hit") -> None:
    """Count ``restores`` (entry id, version id, bytes, compile seconds) in ``session``'s transaction:
    each entry and version once, one ``kind`` event per restore. For a resolve with no HitLog at
    hand, and for fallback answers (``cachesvc.resolve.fallback``), which are counted in the request."""
    now = utcnow()
    rows = list(restores)
    _write(session.connection(), {e: (1, now) for e, _, _, _ in rows}, {v: (1, now) for _, v, _, _ in rows},
           [_event(e, v, nbytes, seconds, now, kind) for e, v, nbytes, seconds in rows])


def _event(entry_id: int, version_id: int, nbytes: int, seconds: Optional[float], at: dt.datetime,
           kind: str = "hit") -> dict:
    return {"kind": kind, "at": at, "entry_id": entry_id, "version_id": version_id, "bytes": nbytes,
            "seconds": seconds}


def _add(tally: Tally, ident: int, n: int, when: dt.datetime) -> None:
    old_n, old_when = tally.get(ident, (0, when))
    tally[ident] = (old_n + n, max(old_when, when))


class HitLog:
    def __init__(self, db: Database, interval: float):
        self._db = db
        self.interval = float(interval)
        self._lock = threading.Lock()        # guards the tallies
        self._flush_lock = threading.Lock()  # one flush at a time
        self._entries: Tally = {}
        self._versions: Tally = {}
        self._events: List[dict] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._pid = 0  # the process the thread runs in (a fork has none)

    def record(self, entry_id: int, version_id: int, nbytes: int, seconds: Optional[float]) -> None:
        """Count one restore of ``version_id`` of ``entry_id`` (written by the next flush)."""
        now = utcnow()
        with self._lock:
            _add(self._entries, entry_id, 1, now)
            _add(self._versions, version_id, 1, now)
            self._events.append(_event(entry_id, version_id, nbytes, seconds, now))
        if self.interval <= 0:
            self.flush()
        elif self._pid != os.getpid():
            self._start()

    def pending(self) -> int:
        """Hits recorded and not yet written."""
        with self._lock:
            return len(self._events)

    def flush(self) -> int:
        """Write the tallies now; return how many hits were written. Raises what the database raises."""
        with self._flush_lock:
            with self._lock:
                entries, versions, events = self._entries, self._versions, self._events
                self._entries, self._versions, self._events = {}, {}, []
            if not events:
                return 0
            try:
                with self._db.session() as s:
                    _write(s.connection(), entries, versions, events)
            except BaseException:
                with self._lock:  # keep them for the next flush
                    for mine, theirs in ((self._entries, entries), (self._versions, versions)):
                        for ident, (n, when) in theirs.items():
                            _add(mine, ident, n, when)
                    self._events[:0] = events
                raise
            return len(events)

    def _start(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
            self._stop.clear()
            self._thread = threading.Thread(target=_run, args=(weakref.ref(self), self._stop, self.interval),
                                            name="cachesvc-hit-flush", daemon=True)
            self._thread.start()
        atexit.register(_close_at_exit, weakref.ref(self))

    def close(self) -> None:
        """Stop the flush thread and write what is left."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        self._thread, self._pid = None, 0
        self.flush()


def _run(ref, stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        hits = ref()
        if hits is None:
            return
        try:
            hits.flush()
        except Exception as exc:  # noqa: BLE001 - keep counting; the tallies wait for the next flush
            log.warning("writing restore counters failed (%s: %s); retrying in %.0f s",
                        type(exc).__name__, exc, interval)
        del hits


def _close_at_exit(ref) -> None:
    hits = ref()
    if hits is not None:
        try:
            hits.close()
        except Exception as exc:  # noqa: BLE001 - at exit there is nobody left to tell but the log
            log.warning("writing restore counters at exit failed: %s: %s", type(exc).__name__, exc)
