"""What the cache holds, costs and saves: totals and a daily series, from the index.

Stored bytes over time come from ``stored`` and ``freed`` events (written when
blob rows are added and when GC deletes them); hits from ``hit`` events; ``fallbacks`` counts ``fallback`` events
(one per version a fallback restore delivered; the exact key's miss is
counted too). Each
hit counts its version's ``compile_seconds`` as saved (the publisher's cold
compile time, recorded in the event so it survives a purge).
"""
from __future__ import annotations

import datetime as dt
from typing import Dict, List

from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from .models import AuditRecord, Blob, Event, Version, utcnow


def totals(session: Session) -> Dict[str, float]:
    """Counts and byte totals over the whole index."""
    committed = Version.state == "committed"
    entries, versions, logical = session.execute(
        select(func.count(distinct(Version.entry_id)), func.count(Version.id),
               func.coalesce(func.sum(Version.total_bytes), 0)).where(committed)).one()
    blobs, stored = session.execute(select(func.count(), func.coalesce(func.sum(Blob.stored_size), 0))
                                    .select_from(Blob)).one()
    by_kind = {k: (n, sec) for k, n, sec in session.execute(
        select(Event.kind, func.count(), func.coalesce(func.sum(Event.seconds), 0.0)).group_by(Event.kind))}
    logical, stored = int(logical), int(stored)  # PostgreSQL sums are Decimal
    gc_runs = session.scalar(select(func.count()).select_from(AuditRecord).where(AuditRecord.action == "gc"))
    hits, misses = by_kind.get("hit", (0, 0))[0], by_kind.get("miss", (0, 0))[0]
    return {
        "entries": entries, "versions": versions, "blobs": blobs,
        "logical_bytes": logical, "stored_bytes": stored,
        "dedup_ratio": round(logical / stored, 3) if stored else None,
        "publishes": by_kind.get("publish", (0, 0))[0],
        "restores": hits, "hits": hits, "misses": misses,
        "fallbacks": by_kind.get("fallback", (0, 0))[0],  # versions restored as a fallback (cachesvc.fallback)
        "hit_rate": round(hits / (hits + misses), 3) if hits + misses else None,
        "compile_seconds_saved": round(float(by_kind.get("hit", (0, 0.0))[1]), 3),
        "gc_runs": gc_runs,
    }


def daily(session: Session, days: int = 30, today: dt.date | None = None) -> List[dict]:
    """One row per day for the last ``days`` days: stored bytes at the day's end, hits, misses, publishes."""
    today = today or utcnow().date()
    first = today - dt.timedelta(days=days - 1)
    start = dt.datetime.combine(first, dt.time())
    before = dict(session.execute(select(Event.kind, func.coalesce(func.sum(Event.bytes), 0))
                                  .where(Event.at < start, Event.kind.in_(("stored", "freed")))
                                  .group_by(Event.kind)).all())
    day = func.date(Event.at)
    per_day: Dict[str, Dict[str, tuple]] = {}
    for d, kind, n, nbytes in session.execute(select(day, Event.kind, func.count(), func.coalesce(func.sum(Event.bytes), 0))
                                              .where(Event.at >= start).group_by(day, Event.kind)):
        per_day.setdefault(str(d), {})[kind] = (n, int(nbytes))
    stored = int(before.get("stored", 0)) - int(before.get("freed", 0))
    rows = []
    for i in range(days):
        d = (first + dt.timedelta(days=i)).isoformat()
        k = per_day.get(d, {})
        stored += k.get("stored", (0, 0))[1] - k.get("freed", (0, 0))[1]
        rows.append({"date": d, "stored_bytes": stored, "hits": k.get("hit", (0, 0))[0],
                     "misses": k.get("miss", (0, 0))[0], "publishes": k.get("publish", (0, 0))[0]})
    return rows
