"""Sign-in for people on the HTML pages: a token typed into a form, then a signed session cookie.

    GET  /login    the form (also what a page answers 401 with, for a browser)
    POST /login    check the token, start a session, go back to the page asked for
    POST /logout   end the session

The session is Flask's own signed cookie (``SECRET_KEY``; ``auth.sign_in`` says what it
holds and how each request checks it against the tokens table). The cookie is HttpOnly,
SameSite=Lax, expires after ``SESSION_HOURS`` and is Secure over https (always with
``COOKIE_SECURE``). Every form that POSTs on the pages carries a CSRF token
(Flask-WTF's ``CSRFProtect``: a token tied to the session and signed with the same key),
checked before the view runs; the API under /api/v1 is not touched by either, since the
cookie authenticates nothing there.

Errors on the pages are HTML pages for browsers (a request whose Accept prefers
text/html over JSON), and the JSON errors of ``cachesvc.errors`` for everything else.
"""
from __future__ import annotations

import datetime as dt
import logging
import secrets
from urllib.parse import urlsplit

from flask import Blueprint, Flask, g, redirect, render_template, request, url_for
from flask.sessions import SecureCookieSessionInterface
from flask_wtf.csrf import CSRFError, CSRFProtect
from werkzeug.exceptions import HTTPException

from .. import auth, errors
from ..services import services
from ..errors import CacheError, Unauthorized
from ..config import Settings

log = logging.getLogger(__name__)

csrf = CSRFProtect()


class _SessionInterface(SecureCookieSessionInterface):
    """Flask's signed cookie session, Secure whenever the request itself came over https."""

    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(app.config["SESSION_COOKIE_SECURE"]) or request.is_secure


def install(app: Flask, settings: Settings) -> None:
    """Configure the session cookie and CSRF on ``app`` (before the page blueprints are registered)."""
    key = settings.SECRET_KEY
    if not key:
        key = secrets.token_hex(32)
        if not settings.TESTING:
                log.warning("CACHESVC_SECRET_KEY is unset: a random key signs this process's sign-ins, so they "
                        "end when it restarts and hold on this replica only (docs/operations.md)")
    app.config.update(
        SECRET_KEY=key,
        SESSION_COOKIE_NAME="cachesvc_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=bool(settings.COOKIE_SECURE),
        PERMANENT_SESSION_LIFETIME=dt.timedelta(hours=settings.SESSION_HOURS),
        WTF_CSRF_CHECK_DEFAULT=False,  # the pages check (below); the API takes no cookie, so needs none
        WTF_CSRF_TIME_LIMIT=None,      # as long as the session: a page left open for an hour still works
    )
    app.session_interface = _SessionInterface()
    csrf.init_app(app)


def page_blueprint(page_bp: Blueprint) -> Blueprint:
    """Make ``page_bp`` a blueprint of pages: POSTs checked for CSRF, errors as HTML for browsers.
    Called where each is defined (a blueprint takes no hooks once an app registered it)."""
    page_bp.before_request(_check_csrf)
    page_bp.register_error_handler(CacheError, page_error)
    page_bp.register_error_handler(HTTPException, page_error)
    return page_bp


def _check_csrf() -> None:
    """Before every page view (after authentication): a POST must carry the session's CSRF token."""
    if request.method == "POST":
        csrf.protect()


def wants_html() -> bool:
    return request.accept_mimetypes.best_match(["application/json", "text/html"]) == "text/html"


def _this_page() -> str:
    """Where signing in returns to: this page and its query, or the page alone for a query that is not UTF-8
    (authentication comes first, so a 401 may meet one; the page then refuses it with a 400)."""
    try:
        return request.full_path.rstrip("?")
    except UnicodeDecodeError:
        return request.path


def page_error(exc: Exception):
    """A page's error: HTML for a browser (401: the sign-in form), JSON otherwise."""
    if not wants_html():
        return errors.json_error(exc)
    code, message, status, _details = errors.describe(exc)
    if status == 401:
        return _login_form(_this_page(), status=401), 401
    if isinstance(exc, CSRFError):
        message = "This form was not sent by this site's page, or your sign-in changed since: reload the page and try again."
    return render_template("error.html", code=code, message=message, status=status), status


def _local(target: str) -> str:
    """``target`` when it is a path on this site, else "/" (no open redirect)."""
    parts = urlsplit(target or "")
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return url_for("web.index")
    return target


def _login_form(next_path: str, message: str = "", status: int = 200) -> str:
    if not message and getattr(g, "signed_out", False):
        message = "Your sign-in ended (you signed out, it expired, or its token was revoked): sign in again."
    elif not message and status == 401:
        message = "Sign in with a token to see this page."
    return render_template("login.html", next=_local(next_path), message=message)


bp = page_blueprint(Blueprint("account", __name__, template_folder="templates"))


@bp.route("/login", methods=["GET"])
@auth.requires(None)
def login():
    return _login_form(request.args.get("next", ""))


@bp.route("/login", methods=["POST"])
@auth.requires(None)
def login_post():
    token, target = request.form.get("token", ""), _local(request.form.get("next", ""))
    try:
        with services().db.session() as s:
            principal = auth.sign_in(s, token, services().settings.SESSION_HOURS)
    except Unauthorized:
        return _login_form(target, message="Unknown or revoked token: check it and try again."), 401
    log.info("signed in on the pages: %s (%s)", principal.name, principal.scope)
    return redirect(target, code=303)


@bp.route("/logout", methods=["POST"])
@auth.requires(None)
def logout():
    auth.sign_out(services())
    return redirect(url_for("account.login"), code=303)


@bp.app_context_processor
def _who():
    """``me`` (the principal) and ``is_admin`` for every template (the nav, the admin controls)."""
    me = auth.current()
    return {"me": me, "is_admin": auth.includes(me.scope, "admin"), "signed_in": getattr(g, "signed_in", False)}

