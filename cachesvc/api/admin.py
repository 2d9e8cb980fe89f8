"""Admin: purge, garbage collection, the audit log and tokens. Everything here needs `admin`.

Each view validates its arguments and calls one admin action (``cachesvc.lifecycle.actions``), the same
code the `cachesvc` commands and the scheduler run.
"""
from __future__ import annotations


from .. import lifecycle
from ..auth import requires
from ..schemas import AuditArgs, PurgeSchema, TokenCreateSchema
from .answers import AuditListSchema, GcSchema, TokenCreatedSchema, TokenListSchema, TokenRevokedSchema
from .version_answers import PurgeAnswerSchema
from ..services import services
from . import Blueprint

blp = Blueprint("admin", __name__, url_prefix="/api/v1/admin", description="Purge, GC, audit log, tokens")


@blp.route("/purge", methods=["POST"])
@requires("admin")
@blp.arguments(PurgeSchema)
@blp.response(200, PurgeAnswerSchema)
def purge(body):
    """Purge the committed versions matching every given criterion (AND), then run GC.

    `max_total_bytes` then evicts, of the matching versions, the least recently
    restored until the stored bytes of the committed versions fit. At least one
    criterion is required (400). `dry_run` reports and changes nothing. Purged
    versions stop resolving at once; their blobs are deleted by a GC once
    `CACHESVC_GC_GRACE_SECONDS` have passed, so restores already under way finish.
    """
    dry_run = body.pop("dry_run")
    return lifecycle.purge(services(), body, actor=lifecycle.request_actor(), dry_run=dry_run)


@blp.route("/gc", methods=["POST"])
@requires("admin")
@blp.response(200, GcSchema)
def gc():
    """Delete blobs no protecting version names (committed; pending within its lease; purged within the
    grace), the rows of expired pending and long-purged versions, and orphan objects in storage."""
    return lifecycle.gc(services(), actor=lifecycle.request_actor())


@blp.route("/audit", methods=["GET"])
@requires("admin")
@blp.arguments(AuditArgs, location="query")
@blp.response(200, AuditListSchema)
def audit_log(args):
    """Audit records, newest first: who published, purged, collected or changed tokens, when, and bytes."""
    with services().db.session() as s:
        return lifecycle.audit_listing(s, args.get("action"), args["limit"], args["offset"])


@blp.route("/tokens", methods=["GET"])
@requires("admin")
@blp.response(200, TokenListSchema)
def list_tokens():
    """Every token (never the token itself): name, scope, created, revoked."""
    return lifecycle.list_tokens(services())


@blp.route("/tokens", methods=["POST"])
@requires("admin")
@blp.arguments(TokenCreateSchema)
@blp.response(201, TokenCreatedSchema)
def create_token(body):
    """Create a token; the answer's `token` is the only time it is shown."""
    return lifecycle.create_token(services(), body["name"], body["scope"], actor=lifecycle.request_actor())


@blp.route("/tokens/<ident>", methods=["DELETE"])
@requires("admin")
@blp.response(200, TokenRevokedSchema)
def revoke_token(ident):
    """Revoke the active token(s) with this id or name (404 when none is active)."""
    return lifecycle.revoke_token(services(), ident, actor=lifecycle.request_actor())
