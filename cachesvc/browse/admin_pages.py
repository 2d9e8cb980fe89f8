"""Admin pages: purge a version or an entry (a dry-run preview, then a confirmation), the audit log, tokens.

Every view needs `admin` and calls the one admin action there is for it (``cachesvc.lifecycle.actions``),
as the admin API and the `cachesvc` commands do, so a purge from a page is audited, collected
and counted exactly as one from the CLI. Forms POST with the session's CSRF token
(``cachesvc.browse.signin``); the preview is a GET that changes nothing.
"""
from __future__ import annotations

from flask import Blueprint, make_response, redirect, render_template, request, url_for
from marshmallow import ValidationError

from .. import lifecycle
from ..api import services
from ..auth import requires
from ..errors import InvalidRequest
from ..models import MAX_ID
from ..schemas import AuditArgs, TokenCreateSchema
from .signin import page_blueprint

bp = page_blueprint(Blueprint("web_admin", __name__, url_prefix="/admin", template_folder="templates"))

AUDIT_PAGE = 100


def _target(values) -> dict:
    """The purge criterion a form or query names: ``{"version_id": N}`` or ``{"entry_id": N}``."""
    given = [(field, values.get(arg, "").strip()) for arg, field in (("version", "version_id"), ("entry", "entry_id"))
             if values.get(arg, "").strip()]
    if len(given) != 1:
        raise InvalidRequest("name one version (version=ID) or one entry (entry=ID) to purge")
    field, raw = given[0]
    # the length first: int() of more than 4,300 digits raises ValueError (a 500), and no id is that long
    if len(raw) > len(str(MAX_ID)) or not (raw.isascii() and raw.isdigit()) or not 0 < int(raw) <= MAX_ID:
        raise InvalidRequest(f"{field.split('_')[0]} must be a positive id of at most {len(str(MAX_ID))} digits, "
                             f"not {raw[:40]!r}{'...' if len(raw) > 40 else ''}")
    return {field: int(raw)}


def _what(target: dict) -> str:
    field, ident = next(iter(target.items()))
    return f"{field.split('_')[0]} {ident}"


@bp.route("/purge", methods=["GET"])
@requires("admin")
def purge_preview():
    """What purging this version or entry would do (a dry run): the versions, the bytes it frees."""
    target = _target(request.args)
    result = lifecycle.purge(services(), target, actor=lifecycle.request_actor(), dry_run=True)
    return render_template("purge.html", result=result, target=target, what=_what(target), done=False)


@bp.route("/purge", methods=["POST"])
@requires("admin")
def purge_confirmed():
    target = _target(request.form)
    result = lifecycle.purge(services(), target, actor=lifecycle.request_actor())
    return render_template("purge.html", result=result, target=target, what=_what(target), done=True)


@bp.route("/audit", methods=["GET"])
@requires("admin")
def audit_page():
    try:
        args = AuditArgs().load({k: v for k, v in request.args.items() if k in ("action", "offset") and v})
    except ValidationError as exc:
        raise InvalidRequest(f"invalid request: {exc.messages}") from None
    with services().db.session() as s:
        page = lifecycle.audit_listing(s, args.get("action"), AUDIT_PAGE, args["offset"])
    return render_template("audit.html", page=page, action=args.get("action") or "", actions=lifecycle.AUDIT_ACTIONS,
                           page_size=AUDIT_PAGE)


@bp.route("/tokens", methods=["GET"])
@requires("admin")
def tokens_page():
    return render_template("tokens.html", tokens=lifecycle.list_tokens(services())["tokens"], created=None)


@bp.route("/tokens", methods=["POST"])
@requires("admin")
def create_token():
    """Create a token and show it, once: the answer is not cached, and the secret is never in a URL."""
    try:
        body = TokenCreateSchema().load({"name": request.form.get("name", "").strip(),
                                         "scope": request.form.get("scope", "")})
    except ValidationError as exc:
        problems = "; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in exc.messages.items())
        raise InvalidRequest(f"invalid token: {problems}") from None
    created = lifecycle.create_token(services(), body["name"], body["scope"], actor=lifecycle.request_actor())
    resp = make_response(render_template("tokens.html", tokens=lifecycle.list_tokens(services())["tokens"],
                                         created=created), 201)
    resp.headers["Cache-Control"] = "no-store"
    return resp


@bp.route("/tokens/<int:token_id>/revoke", methods=["POST"])
@requires("admin")
def revoke_token(token_id):
    lifecycle.revoke_token(services(), str(token_id), actor=lifecycle.request_actor())
    return redirect(url_for("web_admin.tokens_page"), code=303)
