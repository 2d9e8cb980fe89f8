"""Admin actions: purge, garbage collection and tokens, each written once, each writing its audit record.

The admin API (``api/admin.py``), the `cachesvc` commands working on the database
directly (``cachesvc.cli``) and the scheduled eviction (``scheduler.py``) all call
these, so what an action does and what it records cannot drift between them.
``svc`` is the app's ``Services`` (``app.build_services``); ``actor`` names who asked
(``token:<name>``, ``cli:<user>``, ``scheduler``).

Audit records: ``purge`` when a purge changed something (dry runs and purges that
matched nothing change nothing), ``gc`` for every collection, ``token.create`` and
``token.revoke`` for every token. Arguments are validated by the callers with the
request schemas (``schemas.PurgeSchema``, ``schemas.TokenCreateSchema``); the actions
still refuse what would break them (``InvalidRequest``).
"""
from __future__ import annotations

from sqlalchemy import select

from . import audit, collect
from .. import auth
from ..errors import InvalidRequest
from ..models import Token


def purge(svc, criteria: dict, *, actor: str, dry_run: bool = False) -> dict:
    """Purge the committed versions matching every criterion (``collect.purge``), then collect
    garbage unless ``dry_run``. Returns purge's answer with ``gc`` (GC's answer, or None)."""
    with svc.db.session() as s:
        result = collect.purge(s, criteria, dry_run=dry_run)
        if not dry_run and result["version_count"]:
            audit.record(s, "purge", actor, ", ".join(f"{k}={v}" for k, v in result["criteria"].items()),
                         result["bytes_freed"], {"criteria": result["criteria"],
                                                 "versions": [v["id"] for v in result["versions"]],
                                                 "entries": [e["name"] for e in result["entries"]]})
    result["gc"] = None if dry_run else gc(svc, actor=actor)
    return result


def gc(svc, *, actor: str) -> dict:
    """Collect garbage (``collect.gc``) and record it (its own transaction: GC commits in batches)."""
    result = collect.gc(svc.db, svc.storage, svc.settings)
    with svc.db.session() as s:
        audit.record(s, "gc", actor, "blobs", result["bytes_freed"], result)
    return result


def list_tokens(svc) -> dict:
    """``{"tokens": [...]}``: every token's id, name, scope, created and revoked (never the token)."""
    with svc.db.session() as s:
        return {"tokens": [auth.token_summary(t) for t in s.scalars(select(Token).order_by(Token.id))]}


def create_token(svc, name: str, scope: str, *, actor: str) -> dict:
    """Create a token; the answer's ``token`` is the only time it is seen."""
    with svc.db.session() as s:
        row, token = auth.create_token(s, name, scope)
        audit.record(s, "token.create", actor, f"token {row.name}", 0, {"id": row.id, "scope": row.scope})
        return dict(auth.token_summary(row), token=token)


def revoke_token(svc, ident: str, *, actor: str) -> dict:
    """Revoke the active tokens with id or name ``ident``: ``{"revoked": [...]}``; NotFound when none is.

    This process stops honouring them at once; other serving processes within TOKEN_CACHE_SECONDS.
    """
    if not ident or len(ident) > 100 or not ident.isprintable():  # a name is 1-100 printable characters
        raise InvalidRequest("a token id or name is 1-100 printable characters")
    with svc.db.session() as s:
        rows = auth.revoke_token(s, ident)
        for row in rows:
            audit.record(s, "token.revoke", actor, f"token {row.name}", 0, {"id": row.id, "scope": row.scope})
        revoked = [auth.token_summary(r) for r in rows]
    svc.tokens.clear()
    return {"revoked": revoked}
