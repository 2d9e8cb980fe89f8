"""Bearer tokens with nested scopes: ``read`` < ``write`` < ``admin``.

A token is ``cs_`` + 43 url-safe characters (32 random bytes). Only its
sha256 is stored (a salt adds nothing for 256 random bits); the row is found
by that hash and the hash is compared again with ``hmac.compare_digest``.

Every view declares what it needs with ``@requires(scope)`` (or
``@requires(None)`` for open endpoints such as /healthz). ``check_request``
runs as a ``before_request`` hook, so authentication happens before the view's
arguments or body are parsed: a request without the right token gets 401 or
403 whatever its body. A view that declares nothing needs ``admin`` (fail
closed). Anonymous requests get ``read`` when ``CACHESVC_ANONYMOUS_READ`` is
on, nothing otherwise; writing always needs a token.

People sign in on the pages (``cachesvc.browse.signin``): the signed session cookie
holds a random session id, never the token; ``page_sessions`` holds its sha256, its
token and its end, and sign-out deletes it. Requests to the page blueprints
(``PAGE_BLUEPRINTS``) without an Authorization header are authenticated by it,
checked against that table and the tokens table on every request (no cache), so
a revoked token signs its sessions out at once. The
cookie authenticates nothing under /api: the API needs no CSRF defence.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import datetime as dt
import secrets
from dataclasses import dataclass
from typing import Callable, Optional

from flask import current_app, g, request, session as cookie_session
from sqlalchemy import delete, false, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .errors import Forbidden, InvalidRequest, NotFound, Unauthorized
from .models import MAX_ID, PageSession, Token, utcnow

SCOPES = ("read", "write", "admin")
_RANK = {s: i for i, s in enumerate(SCOPES)}
_OPEN = "open"  # marker: no token needed
#: endpoints of other packages (flask-smorest's own doc routes) and what they need
_FOREIGN = {"api-docs.openapi_json": _OPEN, "api-docs.openapi_swagger_ui": _OPEN, "static": _OPEN,
            "web.static": _OPEN}
#: the blueprints whose requests a session cookie may authenticate (the HTML pages)
PAGE_BLUEPRINTS = frozenset({"web", "account", "web_admin"})
_SESSION_KEY = "signed_in"  # {"sid": the page session's random id (page_sessions holds its sha256)}


@dataclass(frozen=True)
class Principal:
    name: str              # "token:<name>" or "anonymous"
    scope: Optional[str]   # None: may do nothing that needs a scope
    token_id: Optional[int] = None


ANONYMOUS = Principal("anonymous", None)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "cs_" + secrets.token_urlsafe(32)


def includes(have: Optional[str], need: str) -> bool:
    """True when scope ``have`` grants ``need`` (admin includes write includes read)."""
    return have is not None and _RANK[have] >= _RANK[need]


def requires(scope: Optional[str], open_if: Optional[str] = None, anonymous: bool = True) -> Callable:
    """Declare the scope a view needs (``None``: open to everyone). Enforced by ``check_request``.

    ``open_if`` names a boolean setting: when it is on the view is open; when off it needs a
    token with ``scope`` (anonymous read does not count). ``anonymous=False``: a ``read`` view that
    needs a token even when ``CACHESVC_ANONYMOUS_READ`` lets requests without one read (a damage
    report, which makes the service read a blob back and may forget it).
    """
    if scope is not None and scope not in _RANK:
        raise ValueError(f"unknown scope {scope!r}")

    def deco(view):
        view._cachesvc_scope = scope or _OPEN
        view._cachesvc_open_if = open_if
        view._cachesvc_anonymous = anonymous and open_if is None
        if scope is not None:  # the OpenAPI document says so too
            doc = view.__dict__.setdefault("_apidoc", {}).setdefault("manual_doc", {})
            doc["security"] = [{"bearerAuth": []}]
            responses = doc.setdefault("responses", {})
            responses["401"] = {"description": "Missing or unknown token",
                                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            responses["403"] = {"description": f"The token's scope does not include `{scope}`",
                                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        return view
    return deco


def required_scope(endpoint: Optional[str]) -> str:
    """What the view behind ``endpoint`` needs: a scope name or ``"open"``; undeclared views need admin."""
    if endpoint is None:  # no route matched: let Flask answer 404/405
        return _OPEN
    if endpoint in _FOREIGN:
        return _FOREIGN[endpoint]
    view = current_app.view_functions.get(endpoint)
    return getattr(view, "_cachesvc_scope", "admin")


def authenticate(session: Session, header: Optional[str]) -> Principal:
    """The principal behind an Authorization header; raises Unauthorized for a bad or unknown token."""
    if not header:
        return ANONYMOUS
    kind, _, token = header.partition(" ")
    token = token.strip()
    if kind.lower() != "bearer" or not token:
        raise Unauthorized("Authorization must be `Bearer <token>`")
    digest = hash_token(token)
    row = session.scalars(select(Token).where(Token.token_hash == digest)).first()
    if row is None or row.revoked_at is not None or not hmac.compare_digest(row.token_hash, digest):
        raise Unauthorized("unknown or revoked token")
    return Principal(f"token:{row.name}", row.scope, row.id)


def cached_principal(svc, header: Optional[str]) -> Principal:
    """``authenticate`` through the app's token cache (``TOKEN_CACHE_SECONDS``).

    A known token's principal is reused for that long, so a token revoked by
    another process (the CLI, another worker) keeps working at most that long;
    a revocation through this process's admin API clears the cache at once.
    Unknown tokens are never cached.
    """
    if not header:
        return ANONYMOUS
    key = hash_token(header)  # the cache holds no token
    principal = svc.tokens.get(key)
    if principal is None:
        with svc.db.session() as s:
            principal = authenticate(s, header)
        svc.tokens.put(key, principal)
    return principal


def sign_in(session: Session, token: str, hours: float) -> Principal:
    """Check ``token`` (Unauthorized when unknown or revoked) and start a fresh session for it: a
    ``page_sessions`` row that lasts ``hours``, whose random id the signed cookie holds."""
    principal = authenticate(session, f"Bearer {token.strip()}")
    sid = secrets.token_urlsafe(32)
    now = utcnow()
    session.add(PageSession(id_hash=hash_token(sid), token_id=principal.token_id, created_at=now,
                            expires_at=now + dt.timedelta(hours=hours)))
    cookie_session.clear()  # a new session on every sign-in: nothing from before it carries over
    cookie_session[_SESSION_KEY] = {"sid": sid}
    cookie_session.permanent = True  # the cookie expires with it (PERMANENT_SESSION_LIFETIME)
    return principal


def sign_out(svc) -> None:
    """End the session on the server (its row is deleted: a copy of the cookie opens nothing) and in
    the browser."""
    sid = _cookie_sid()
    if sid:
        with svc.db.session() as s:
            s.execute(delete(PageSession).where(PageSession.id_hash == hash_token(sid)))
    cookie_session.clear()


def hold_for_page(svc, value: dict) -> bool:
    """Keep ``value`` (JSON) in this sign-in's row for the next page to show once (``take_from_page``): never in
    the cookie, which is signed, not encrypted. False when the request has no page session to keep it in."""
    sid = _cookie_sid()
    if sid is None:
        return False
    with svc.db.session() as s:
        held = s.execute(update(PageSession).where(PageSession.id_hash == hash_token(sid))
                         .values(flash=json.dumps(value)))
        return held.rowcount == 1


def take_from_page(svc) -> Optional[dict]:
    """What ``hold_for_page`` kept for this sign-in, emptied as it is read, so one request gets it (a refresh,
    or two at once, get None)."""
    sid = _cookie_sid()
    if sid is None:
        return None
    with svc.db.session() as s:
        row = PageSession.id_hash == hash_token(sid)
        held = s.scalar(select(PageSession.flash).where(row))
        if held is None or s.execute(update(PageSession).where(row, PageSession.flash == held)
                                     .values(flash=None)).rowcount != 1:
            return None
    return json.loads(held)


def _cookie_sid() -> Optional[str]:
    data = cookie_session.get(_SESSION_KEY)
    sid = data.get("sid") if isinstance(data, dict) else None
    return sid if isinstance(sid, str) and 0 < len(sid) <= 100 else None


def session_principal(svc) -> Principal:
    """The principal of the session cookie, looked up now; ANONYMOUS when there is none.

    A session that the server no longer has (signed out, expired, or from before page_sessions), or
    whose token is revoked, is cleared, and ``g.signed_out`` says why the person is anonymous again.
    """
    sid = _cookie_sid()
    if sid is None:
        if _SESSION_KEY in cookie_session:
            cookie_session.clear()
        return ANONYMOUS
    with svc.db.session() as s:
        found = s.execute(select(PageSession, Token).join(Token, Token.id == PageSession.token_id).where(
            PageSession.id_hash == hash_token(sid))).first()
        live = found is not None and found[1].revoked_at is None and found[0].expires_at > utcnow()
        principal = Principal(f"token:{found[1].name}", found[1].scope, found[1].id) if live else None
    if principal is None:
        cookie_session.clear()
        g.signed_out = True
        return ANONYMOUS
    g.signed_in = True  # by the cookie (the pages offer to sign out), not by a bearer token
    return principal


def _request_principal(svc) -> Principal:
    """The Authorization header's principal; for a page without one, the session cookie's."""
    header = request.headers.get("Authorization")
    if not header and request.blueprint in PAGE_BLUEPRINTS:
        return session_principal(svc)
    return cached_principal(svc, header)


def check_request() -> None:
    """``before_request`` hook: authenticate, then authorize against the view's declared scope."""
    svc = current_app.extensions["cachesvc"]
    need = required_scope(request.endpoint)
    view = current_app.view_functions.get(request.endpoint)
    open_if = getattr(view, "_cachesvc_open_if", None)
    if need == _OPEN or (open_if and getattr(svc.settings, open_if)):
        # the sign-in page still knows who is signed in; open API endpoints read no token at all
        g.principal = session_principal(svc) if request.blueprint in PAGE_BLUEPRINTS else ANONYMOUS
        return
    principal = _request_principal(svc)
    if principal is ANONYMOUS:
        if need == "read" and svc.settings.ANONYMOUS_READ and getattr(view, "_cachesvc_anonymous", True):
            principal = Principal("anonymous", "read")
        else:
            raise Unauthorized(f"this needs a bearer token with scope `{need}`: send `Authorization: Bearer "
                               f"<token>` (CACHESVC_TOKEN for the client)")
    g.principal = principal  # before the scope check: a refused page still says who is signed in
    if not includes(principal.scope, need):
        raise Forbidden(f"{principal.name} has scope `{principal.scope}`; this needs `{need}`")


def current() -> Principal:
    return getattr(g, "principal", ANONYMOUS)


# -- token management (CLI and admin API) ------------------------------------------

def create_token(session: Session, name: str, scope: str) -> tuple[Token, str]:
    """Create a token; return (row, the token itself), the only time the token is seen."""
    if scope not in _RANK:
        raise InvalidRequest(f"scope must be one of {', '.join(SCOPES)}")
    if not name or len(name) > 100:
        raise InvalidRequest("token name must be 1-100 characters")
    taken = InvalidRequest(f"a token named {name!r} is already active: choose another name, or revoke it first "
                           f"(`cachesvc token revoke {name}`)")
    if session.scalar(select(Token.id).where(Token.name == name, Token.revoked_at.is_(None))) is not None:
        raise taken
    token = new_token()
    row = Token(name=name, scope=scope, token_hash=hash_token(token), created_at=utcnow())
    session.add(row)
    try:
        with session.begin_nested():  # a concurrent create of the same name: the unique index decides
            session.flush()
    except IntegrityError:
        raise taken from None
    return row, token


def revoke_token(session: Session, ident: str) -> list[Token]:
    """Revoke the active token whose id or name is ``ident`` (names of active tokens are unique: one row);
    raise NotFound when none is."""
    q = select(Token).where(Token.revoked_at.is_(None))
    if ident.isascii() and ident.isdigit():  # str.isdigit() alone also takes '²', which int() refuses
        q = q.where(Token.id == int(ident) if int(ident) <= MAX_ID else false())
    else:
        q = q.where(Token.name == ident)
    rows = list(session.scalars(q))
    if not rows:
        raise NotFound(f"no active token has id or name {ident!r}")
    now = utcnow()
    for row in rows:
        row.revoked_at = now
    return rows


def token_summary(t: Token) -> dict:
    from .index import iso

    return {"id": t.id, "name": t.name, "scope": t.scope, "created_at": iso(t.created_at),
            "revoked_at": iso(t.revoked_at)}
