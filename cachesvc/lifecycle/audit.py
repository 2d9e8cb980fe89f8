"""The audit log: who published, purged, collected garbage or changed tokens, when, and how many bytes.

``record`` adds a row to the caller's unit of work, so the record commits or
rolls back with the change it describes. Admins read it at
``GET /api/v1/admin/audit``.
"""
from __future__ import annotations

import getpass
from typing import Any, Optional

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..index import iso
from ..models import AuditRecord, utcnow

ACTIONS = ("publish", "purge", "gc", "token.create", "token.revoke")


def request_actor() -> str:
    """The principal of the current request ("token:<name>" or "anonymous")."""
    from .. import auth

    return auth.current().name


def cli_actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no passwd entry (containers)
        return "cli"


def record(session: Session, action: str, actor: str, target: str = "", nbytes: int = 0,
           details: Optional[dict] = None) -> AuditRecord:
    if action not in ACTIONS:
        raise ValueError(f"unknown audit action {action!r}")
    row = AuditRecord(at=utcnow(), actor=actor[:120], action=action, target=target[:300], bytes=int(nbytes),
                      details=details or {})
    session.add(row)
    return row


def listing(session: Session, action: Optional[str], limit: int, offset: int) -> dict:
    q = select(AuditRecord)
    if action:
        q = q.where(AuditRecord.action == action)
    rows = session.scalars(q.order_by(AuditRecord.id.desc()).limit(limit).offset(offset)).all()
    return {"limit": limit, "offset": offset, "records": [summary(r) for r in rows]}


def summary(r: AuditRecord) -> dict[str, Any]:
    return {"id": r.id, "at": iso(r.at), "actor": r.actor, "action": r.action, "target": r.target,
            "bytes": r.bytes, "details": r.details or {}}
