"""Admin pages: purge a version or an entry (a dry-run preview, then a confirmation), the audit log, tokens.

Every view needs `admin` and calls the one admin action there is for it (``cachesvc.lifecycle.actions``),
as the admin API and the `cachesvc` commands do, so a purge from a page is audited, collected
and counted exactly as one from the CLI. Forms POST with the session's CSRF token
(``cachesvc.browse.signin``); the preview is a GET that changes nothing.

Every POST answers with a redirect to a GET (post-redirect-get), so a browser's refresh or back
button never sends the form again: what the POST did (a purge's outcome, a new token, shown once)
travels to the page the redirect opens, which takes it out: a purge's outcome in the session cookie, a new
token in the sign-in's server-side row (``auth.hold_for_page``), never in the cookie (signed, not encrypted).
"""
from __future__ import annotations

from typing import Optional

from flask import Blueprint, Response, make_response, redirect, render_template, request, session, url_for
from marshmallow import ValidationError

from .. import lifecycle
from ..services import services
from ..auth import hold_for_page, requires, take_from_page
from ..errors import InvalidRequest, NotFound
from ..models import MAX_ID
from ..schemas import AuditArgs, TokenCreateSchema
from .signin import page_blueprint

bp = page_blueprint(Blueprint("web_admin", __name__, url_prefix="/admin", template_folder="templates"))

AUDIT_PAGE = 100
SHOWN = 10  # versions a purge's outcome page lists (the count says how many there were)


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
    gc = result.get("gc") or {}
    # the outcome rides in the session cookie to the GET: small (a cookie holds 4 kB), the first rows only
    session["purged"] = {"target": target, "version_count": result["version_count"],
                         "bytes_freed": result["bytes_freed"],
                         "gc": {k: gc.get(k, 0) for k in ("blobs_deleted", "bytes_freed")} if gc else None,
                         "versions": [{k: v.get(k) for k in ("id", "entry_id", "name", "total_bytes", "created_at",
                                                            "last_restored_at")} for v in result["versions"][:SHOWN]]}
    return redirect(url_for("web_admin.purge_done"), code=303)


@bp.route("/purge/done", methods=["GET"])
@requires("admin")
def purge_done():
    """What the purge just POSTed did, once; a refresh (the outcome already shown) goes to the entries."""
    done = session.pop("purged", None)
    if done is None:
        return redirect(url_for("web.index"), code=303)
    return render_template("purge.html", result=done, target=done["target"], what=_what(done["target"]), done=True)


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
    """The tokens; right after a create, the new token itself, this once (taken out of the sign-in's row)."""
    return _tokens_page(take_from_page(services()))


def _tokens_page(created: Optional[dict]) -> Response:
    resp = make_response(render_template("tokens.html", tokens=lifecycle.list_tokens(services())["tokens"],
                                         created=created))
    resp.headers["Cache-Control"] = "no-store"  # the one page that may hold a token: never cached
    return resp


@bp.route("/tokens", methods=["POST"])
@requires("admin")
def create_token():
    """Create a token, then redirect to the tokens page, which shows it once (never in a URL)."""
    try:
        body = TokenCreateSchema().load({"name": request.form.get("name", "").strip(),
                                         "scope": request.form.get("scope", "")})
    except ValidationError as exc:
        problems = "; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in exc.messages.items())
        raise InvalidRequest(f"invalid token: {problems}") from None
    created = lifecycle.create_token(services(), body["name"], body["scope"], actor=lifecycle.request_actor())
    shown = {k: created[k] for k in ("name", "scope", "token")}
    if not hold_for_page(services(), shown):  # a bearer header, no sign-in: no row to keep it in, no browser
        return _tokens_page(shown)
    return redirect(url_for("web_admin.tokens_page"), code=303)


@bp.route("/tokens/<int:token_id>/revoke", methods=["GET"])
@requires("admin")
def revoke_confirm(token_id):
    """Revoke a token? The confirmation step (a GET that changes nothing); its form POSTs below."""
    token = next((t for t in lifecycle.list_tokens(services())["tokens"] if t["id"] == token_id), None)
    if token is None or token["revoked_at"]:
        raise NotFound(f"no active token has id {token_id}")
    return render_template("revoke.html", token=token)


@bp.route("/tokens/<int:token_id>/revoke", methods=["POST"])
@requires("admin")
def revoke_token(token_id):
    lifecycle.revoke_token(services(), str(token_id), actor=lifecycle.request_actor())
    return redirect(url_for("web_admin.tokens_page"), code=303)
