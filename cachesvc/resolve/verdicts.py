"""What restoring processes report after they compiled (``client.verify()``).

A verdict names the versions a restore delivered and whether the process's
own cache counters showed hits: ``paid_off``, ``partial`` or ``no_hits``.
Each counts on its versions (``verify_count``); a ``no_hits`` verdict of an
exact-key restore also counts ``no_hit_count`` and, being the last verdict,
makes the version a *problem* (``problem`` in the entries API, marked on the
pages): its files arrive but nothing hits, so every restore of it is wasted
(a changed Inductor config, a torch path that differs, a key that misses a
field). A fallback restore of another shape is expected to miss its graphs,
so its verdict counts but never marks a problem.

Only a verdict sent with a token (any scope: the fleet holds read tokens)
sets ``last_verdict`` and so marks or clears a problem. An anonymous one
(``CACHESVC_ANONYMOUS_READ``) counts in ``verify_count`` alone: anyone who
can reach the service could otherwise flag every version (docs/security.md).
A verdict is not tied to a resolve of the version by the same token: the
service keeps no such record, and a token that may read may resolve first.
"""
from __future__ import annotations

from typing import List, Optional

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ..errors import NotFound
from ..models import MAX_ID, Event, Version, utcnow


def _saved(versions: List[Version], verdict: str, first_call_seconds: Optional[float]) -> Optional[float]:
    cold = [v.compile_seconds for v in versions if v.compile_seconds is not None]
    if verdict == "no_hits" or first_call_seconds is None or not cold:
        return None
    return max(0.0, max(cold) - first_call_seconds)


def record(session: Session, version_ids: List[int], verdict: str, fallback: str,
           first_call_seconds: Optional[float] = None, *, trusted: bool) -> List[dict]:
    """Count ``verdict`` on each version, and the verdict once in the stats (an event of its kind,
    ``cachesvc.readmodel.stats``). It sets ``last_verdict`` (and may mark a problem) only when ``trusted`` (sent
    with a token) and not a fallback's. An exact-key verdict that saw hits and says how long the restored
    process's first call took records the compile seconds it saved: the version's cold compile
    minus that first call, never below 0 (a fallback delivered another key's versions, whose cold
    compile says nothing of this one's: it saves nothing countable). NotFound (nothing recorded)
    when a version does not exist."""
    ids = sorted(set(version_ids))
    known = set(session.scalars(select(Version.id).where(Version.id.in_([i for i in ids if 0 <= i <= MAX_ID]))))
    if set(ids) - known:
        raise NotFound(f"version(s) {', '.join(map(str, sorted(set(ids) - known)))} do not exist")
    values = {"verify_count": Version.verify_count + 1}
    if trusted and not fallback:
        values.update(last_verdict=verdict, last_verified_at=utcnow(),
                      no_hit_count=Version.no_hit_count + (1 if verdict == "no_hits" else 0))
    session.execute(update(Version).where(Version.id.in_(ids)).values(**values))
    rows = session.scalars(select(Version).where(Version.id.in_(ids)).order_by(Version.id)).all()
    session.add(Event(kind=verdict, entry_id=rows[0].entry_id, version_id=rows[0].id,
                      seconds=None if fallback else _saved(rows, verdict, first_call_seconds)))
    return [{"id": v.id, "verify_count": v.verify_count, "no_hit_count": v.no_hit_count,
             "last_verdict": v.last_verdict, "problem": v.problem} for v in rows]
