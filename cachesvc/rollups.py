"""Running totals of the events table, per day and counted kind, kept in the writing transaction.

Every resolve and verdict adds an ``events`` row; the stats and /metrics once summed the whole table
(0.5-3.9 s a scrape at a million rows). Each event now also adds itself to ``event_rollups`` (one row
a day and kind: ``count``, ``bytes``, ``seconds``) in the same transaction, so the stats read a few
rows a day whatever the table holds, and keep their numbers when retention deletes old events
(``cachesvc.lifecycle.retention``). A ``gc`` audit record counts as a ``gc_run``.

The ORM's events are caught before each flush (``install``, once per process); the hit counters'
core insert (``cachesvc.resolve.hits``) calls ``add`` itself. A miss that a fallback answered (it
names a version) counts as ``fallback_restore``, as ``cachesvc.readmodel.stats`` explains.
"""
from __future__ import annotations

import datetime as dt
from typing import Dict, Iterable, List, Optional, Tuple

from sqlalchemy import event, inspect
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from .models import AuditRecord, Event, EventRollup, utcnow


def counted_kind(kind: str, version_id: Optional[int]) -> str:
    return "fallback_restore" if kind == "miss" and version_id is not None else kind


def add(conn, events: Iterable[dict]) -> None:
    """Add ``events`` (dicts with ``at``, ``kind``, ``version_id``, ``bytes``, ``seconds``) to the rollups,
    on ``conn`` (the transaction that writes them)."""
    sums: Dict[Tuple[dt.date, str], List[float]] = {}
    for e in events:
        row = sums.setdefault(((e.get("at") or utcnow()).date(), counted_kind(e["kind"], e.get("version_id"))),
                              [0, 0, 0.0])
        sign = e.get("sign", 1)  # -1 takes an event back out (it changed kind, see _before_flush)
        row[0] += sign
        row[1] += sign * int(e.get("bytes") or 0)
        row[2] += sign * float(e.get("seconds") or 0.0)
    if not sums:
        return
    t = EventRollup.__table__
    stmt = (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(t)
    stmt = stmt.on_conflict_do_update(index_elements=[t.c.day, t.c.kind], set_={
        "count": t.c.count + stmt.excluded.count, "bytes": t.c.bytes + stmt.excluded.bytes,
        "seconds": t.c.seconds + stmt.excluded.seconds})
    # in key order: two transactions bumping the same rows take their locks in the same order (no deadlock)
    conn.execute(stmt, [{"day": d, "kind": k, "count": n, "bytes": b, "seconds": sec}
                        for (d, k), (n, b, sec) in sorted(sums.items())])


def _row(obj: Event, version_id: Optional[int], sign: int = 1) -> dict:
    return {"at": obj.at, "kind": obj.kind, "version_id": version_id, "bytes": obj.bytes, "seconds": obj.seconds,
            "sign": sign}


def _before_flush(session: Session, _context, _instances) -> None:
    rows = []
    for obj in session.new:
        if isinstance(obj, Event):
            obj.at = obj.at or utcnow()  # the row's day and the rollup's are one
            rows.append(_row(obj, obj.version_id))
        elif isinstance(obj, AuditRecord) and obj.action == "gc":
            obj.at = obj.at or utcnow()
            rows.append({"at": obj.at, "kind": "gc_run"})
    for obj in session.dirty:  # a resolve's miss flushed before its fallback named a version
        if isinstance(obj, Event):
            hist = inspect(obj).attrs.version_id.history
            # an attribute never set before the insert has no old value in its history: it was None
            old = hist.deleted or ([None] if hist.added else [])
            if old and counted_kind(obj.kind, old[0]) != counted_kind(obj.kind, obj.version_id):
                rows += [_row(obj, old[0], -1), _row(obj, obj.version_id)]
    if rows:
        add(session.connection(), rows)


def install() -> None:
    """Keep the rollups for every ORM session of this process (idempotent)."""
    if not event.contains(Session, "before_flush", _before_flush):
        event.listen(Session, "before_flush", _before_flush)
