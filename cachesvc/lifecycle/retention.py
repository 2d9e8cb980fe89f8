"""Retention: events and audit records older than their settings, and ended page sessions, are deleted.

Nothing else ever deleted an ``events`` row (one a resolve and a verdict) or an audit record. The stats
read ``event_rollups`` (``cachesvc.rollups``), which keep their numbers when events go; the pages'
per-entry hit rates read the events themselves, so they cover the retention window. Run by the
scheduler every round (``cachesvc.lifecycle.scheduler``), in batches so no delete holds a long lock.
"""
from __future__ import annotations

import datetime as dt
from typing import Dict, Optional

from sqlalchemy import delete, select

from ..models import AuditRecord, Event, PageSession, utcnow

BATCH = 10_000


def _delete_before(session_factory, model, cutoff: dt.datetime) -> int:
    gone = 0
    while True:
        with session_factory() as s:
            ids = list(s.scalars(select(model.id).where(model.at < cutoff).order_by(model.id).limit(BATCH)))
            if not ids:
                return gone
            s.execute(delete(model).where(model.id.in_(ids)))
        gone += len(ids)


def apply(svc, now: Optional[dt.datetime] = None) -> Dict[str, int]:
    """Delete what ``EVENTS_RETENTION_DAYS`` and ``AUDIT_RETENTION_DAYS`` (0: keep for ever) no longer keep,
    and the page sessions past their end. Returns how many rows of each went."""
    now = now or utcnow()
    out = {"events": 0, "audit": 0}
    for name, model, setting in (("events", Event, "EVENTS_RETENTION_DAYS"), ("audit", AuditRecord,
                                                                             "AUDIT_RETENTION_DAYS")):
        days = float(getattr(svc.settings, setting) or 0)
        if days > 0:
            out[name] = _delete_before(svc.db.session, model, now - dt.timedelta(days=days))
    with svc.db.session() as s:
        out["page_sessions"] = s.execute(delete(PageSession).where(PageSession.expires_at <= now)).rowcount or 0
    return out
