"""Admin: purge, garbage collection, the audit log and tokens. Everything here needs `admin`."""
from __future__ import annotations

from flask_smorest import Blueprint

from .. import audit, auth, collect, metrics
from ..auth import requires
from ..schemas import AuditArgs, PurgeSchema, TokenCreateSchema
from . import services

blp = Blueprint("admin", __name__, url_prefix="/api/v1/admin", description="Purge, GC, audit log, tokens")


def run_gc(actor: str) -> dict:
    """Run GC and write its audit record (own transaction: GC commits in batches)."""
    svc = services()
    result = collect.gc(svc.db, svc.storage, svc.settings)
    with svc.db.session() as s:
        audit.record(s, "gc", actor, "blobs", result["bytes_freed"], result)
    metrics.current().gc_runs.inc()
    return result


@blp.route("/purge", methods=["POST"])
@requires("admin")
@blp.arguments(PurgeSchema)
@blp.response(200)
def purge(body):
    """Purge the committed versions matching every given criterion (AND), then run GC.

    `max_total_bytes` then evicts, of the matching versions, the least recently
    restored until the stored bytes of the committed versions fit. At least one
    criterion is required (400). `dry_run` reports and changes nothing. Purged
    versions stop resolving at once; their blobs are deleted by a GC once
    `CACHESVC_GC_GRACE_SECONDS` have passed, so restores already under way finish.
    """
    dry_run = body.pop("dry_run")
    actor = audit.request_actor()
    svc = services()
    with svc.db.session() as s:
        result = collect.purge(s, body, dry_run=dry_run)
        if not dry_run:
            audit.record(s, "purge", actor, ", ".join(f"{k}={v}" for k, v in result["criteria"].items()),
                         result["bytes_freed"], {"criteria": result["criteria"],
                                                 "versions": [v["id"] for v in result["versions"]],
                                                 "entries": [e["name"] for e in result["entries"]]})
    result["gc"] = None if dry_run else run_gc(actor)
    return result


@blp.route("/gc", methods=["POST"])
@requires("admin")
@blp.response(200)
def gc():
    """Delete blobs no protecting version names (committed; pending within its lease; purged within the
    grace), the rows of expired pending and long-purged versions, and orphan objects in storage."""
    return run_gc(audit.request_actor())


@blp.route("/audit", methods=["GET"])
@requires("admin")
@blp.arguments(AuditArgs, location="query")
@blp.response(200)
def audit_log(args):
    """Audit records, newest first: who published, purged, collected or changed tokens, when, and bytes."""
    with services().db.session() as s:
        return audit.listing(s, args.get("action"), args["limit"], args["offset"])


@blp.route("/tokens", methods=["GET"])
@requires("admin")
@blp.response(200)
def list_tokens():
    """Every token (never the token itself): name, scope, created, revoked."""
    from sqlalchemy import select

    from ..models import Token

    with services().db.session() as s:
        return {"tokens": [auth.token_summary(t) for t in s.scalars(select(Token).order_by(Token.id))]}


@blp.route("/tokens", methods=["POST"])
@requires("admin")
@blp.arguments(TokenCreateSchema)
@blp.response(201)
def create_token(body):
    """Create a token; the answer's `token` is the only time it is shown."""
    actor = audit.request_actor()
    with services().db.session() as s:
        row, token = auth.create_token(s, body["name"], body["scope"])
        audit.record(s, "token.create", actor, f"token {row.name}", 0, {"id": row.id, "scope": row.scope})
        return dict(auth.token_summary(row), token=token)


@blp.route("/tokens/<ident>", methods=["DELETE"])
@requires("admin")
@blp.response(200)
def revoke_token(ident):
    """Revoke the active token(s) with this id or name."""
    actor = audit.request_actor()
    with services().db.session() as s:
        rows = auth.revoke_token(s, ident)
        for row in rows:
            audit.record(s, "token.revoke", actor, f"token {row.name}", 0, {"id": row.id, "scope": row.scope})
    services().tokens.clear()  # this process stops honouring it now; others within TOKEN_CACHE_SECONDS
    return {"revoked": [auth.token_summary(r) for r in rows]}
