"""What the cache holds, costs and saves: totals and a daily series, from the index.

The event counts come from ``event_rollups`` (``cachesvc.rollups``: running totals per day and kind,
kept as events are written), so a scrape reads a few rows a day, not every event ever written.
Stored bytes over time come from ``stored`` and ``freed`` events (written when
blob rows are added and when GC deletes them). What the numbers mean, and the
events they are counted from:

``restores``
    resolves that delivered a version: ``hit`` events (the exact key's newest
    version, ``cachesvc.resolve.hits``) plus ``fallbacks``.
``fallbacks``
    resolves whose exact key had no version and that a fallback answered: ``miss``
    events that name the version the fallback delivered first.
``misses``
    resolves that delivered nothing: ``miss`` events without a version.
``verdicts``, ``hits``
    what restoring processes reported after they compiled (``client.verify()``,
    ``POST /api/v1/verdicts``): one ``paid_off``, ``partial`` or ``no_hits`` event per
    verdict; ``hits`` counts those whose process saw cache hits (paid_off, partial).
    A restore whose process never reports is a restore, not a hit.
``compile_seconds_saved``
    per exact-key hit verdict that carries ``first_call_seconds``: the version's cold compile
    (``compile_seconds``, measured by the publisher) minus that restored first call,
    never below 0 (the verdict's ``seconds``). A verdict without it counts nothing.
"""
from __future__ import annotations

import datetime as dt
from typing import Dict, List, Optional

from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from ..models import Blob, Entry, Event, EventRollup, Version, utcnow

VERDICTS = ("paid_off", "partial", "no_hits")
HIT_VERDICTS = ("paid_off", "partial")

def _ratio(part: int, whole: int) -> Optional[float]:
    return round(part / whole, 3) if whole else None


def totals(session: Session) -> Dict[str, object]:
    """Counts and byte totals over the whole index (what each means: the module docstring)."""
    committed = Version.state == "committed"
    entries, versions, logical = session.execute(
        select(func.count(distinct(Version.entry_id)), func.count(Version.id),
               func.coalesce(func.sum(Version.total_bytes), 0)).where(committed)).one()
    blobs, stored = session.execute(select(func.count(), func.coalesce(func.sum(Blob.stored_size), 0))
                                    .select_from(Blob)).one()
    by_kind = {k: (int(n), float(sec)) for k, n, sec in session.execute(
        select(EventRollup.kind, func.sum(EventRollup.count), func.coalesce(func.sum(EventRollup.seconds), 0.0))
        .group_by(EventRollup.kind))}
    count = {k: n for k, (n, _) in by_kind.items()}
    logical, stored = int(logical), int(stored)  # PostgreSQL sums are Decimal
    gc_runs = count.get("gc_run", 0)
    fallbacks, misses = count.get("fallback_restore", 0), count.get("miss", 0)
    restores = count.get("hit", 0) + fallbacks
    verdicts = {v: count.get(v, 0) for v in VERDICTS}
    hits = sum(verdicts[v] for v in HIT_VERDICTS)
    return {
        "entries": entries, "versions": versions, "blobs": blobs,
        "logical_bytes": logical, "stored_bytes": stored,
        "dedup_ratio": round(logical / stored, 3) if stored else None,
        "publishes": count.get("publish", 0),
        "restores": restores, "misses": misses, "fallbacks": fallbacks,
        "restore_rate": _ratio(restores, restores + misses),
        "verdicts": verdicts, "hits": hits,
        "hit_rate": _ratio(hits, sum(verdicts.values())),
        "compile_seconds_saved": round(sum(by_kind.get(v, (0, 0.0))[1] for v in HIT_VERDICTS), 3),
        "gc_runs": gc_runs,
    }


def daily(session: Session, days: int = 30, today: dt.date | None = None) -> List[dict]:
    """One row per day for the last ``days`` days: stored bytes at the day's end, restores, misses,
    verdicts, hits (verdicts that saw hits), the day's ``hit_rate`` (None without verdicts), the
    compile seconds its verdicts saved, and publishes."""
    today = today or utcnow().date()
    first = today - dt.timedelta(days=days - 1)
    r = EventRollup
    before = dict(session.execute(select(r.kind, func.coalesce(func.sum(r.bytes), 0))
                                  .where(r.day < first, r.kind.in_(("stored", "freed"))).group_by(r.kind)).all())
    per_day: Dict[str, Dict[str, tuple]] = {}
    saved: Dict[str, float] = {}
    for d, kind, n, nbytes, seconds in session.execute(
            select(r.day, r.kind, r.count, r.bytes, r.seconds).where(r.day >= first)):
        per_day.setdefault(str(d), {})[kind] = (int(n), int(nbytes))
        if kind in HIT_VERDICTS:
            saved[str(d)] = saved.get(str(d), 0.0) + float(seconds)
    stored = int(before.get("stored", 0)) - int(before.get("freed", 0))
    rows = []
    for i in range(days):
        d = (first + dt.timedelta(days=i)).isoformat()
        k = per_day.get(d, {})
        n = {kind: k.get(kind, (0, 0))[0] for kind in ("hit", "fallback_restore", "miss", "publish", *VERDICTS)}
        stored += k.get("stored", (0, 0))[1] - k.get("freed", (0, 0))[1]
        hits, verdicts = sum(n[v] for v in HIT_VERDICTS), sum(n[v] for v in VERDICTS)
        rows.append({"date": d, "stored_bytes": stored, "restores": n["hit"] + n["fallback_restore"],
                     "misses": n["miss"], "verdicts": verdicts, "hits": hits, "hit_rate": _ratio(hits, verdicts),
                     "compile_seconds_saved": round(saved.get(d, 0.0), 3), "publishes": n["publish"]})
    return rows


def verdicts_by(session: Session, entry_ids: List[int], per: str = "entry") -> Dict[int, dict]:
    """Verdicts on ``entry_ids``' versions, per entry (``per="entry"``) or per version (``"version"``:
    a verdict counts on the first version it names): ``{id: {"verdicts", "hits", "hit_rate",
    "compile_seconds_saved"}}``; ids without a verdict are absent. Reads ``ix_events_entry_kind``."""
    if not entry_ids:
        return {}
    col = Event.entry_id if per == "entry" else Event.version_id
    out: Dict[int, dict] = {}
    for ident, kind, n, seconds in session.execute(
            select(col, Event.kind, func.count(), func.coalesce(func.sum(Event.seconds), 0.0))
            .where(Event.entry_id.in_(entry_ids), Event.kind.in_(VERDICTS)).group_by(col, Event.kind)):
        row = out.setdefault(ident, {"verdicts": 0, "hits": 0, "compile_seconds_saved": 0.0})
        row["verdicts"] += n
        if kind in HIT_VERDICTS:
            row["hits"] += n
            row["compile_seconds_saved"] = round(row["compile_seconds_saved"] + float(seconds), 3)
    for row in out.values():
        row["hit_rate"] = _ratio(row["hits"], row["verdicts"])
    return out


def served(session: Session) -> Dict[str, List[dict]]:
    """What the cache serves: per device (with its arch and CUDA) and per torch version, the entries
    with a committed version and their restores, most restored first."""
    committed = select(Version.entry_id).where(Version.state == "committed").distinct().subquery()
    out = {}
    for label, cols in (("devices", (Entry.device, Entry.arch, Entry.cuda)), ("torch", (Entry.torch,))):
        rows = session.execute(
            select(*cols, func.count(Entry.id), func.coalesce(func.sum(Entry.restore_count), 0))
            .join(committed, committed.c.entry_id == Entry.id).group_by(*cols)).all()
        out[label] = sorted(({"values": list(r[:-2]), "entries": r[-2], "restores": int(r[-1])} for r in rows),
                            key=lambda r: (-r["restores"], -r["entries"], r["values"]))
    return out
