"""One error family, one table to HTTP, one handler.

Views and services raise ``CacheError`` subclasses; ``register`` turns them
(and Flask's own HTTP errors, request-validation failures, and the lower layers' own errors it is
given, such as storage's) into
``{"error": {"code": ..., "message": ..., "details": ...}}``. The client maps
the same codes back to its exceptions in ``cachesvc_client.errors``.
"""
from __future__ import annotations

import logging
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional

from cachesvc_client.shared.rules import ERROR_CODES
from flask import Flask, jsonify, request
from sqlalchemy.exc import DataError, DBAPIError, InterfaceError, OperationalError
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


class CacheError(Exception):
    """``code`` names the error in the answer; a subclass's HTTP status is the shared table's for its code
    (``cachesvc_client.shared.rules.ERROR_CODES``, which the client maps back)."""
    code = "error"
    status = 500

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.code not in ERROR_CODES:
            raise TypeError(f"{cls.__name__}: error code {cls.code!r} is not in cachesvc_client.shared.rules.ERROR_CODES; "
                            "add it there with its HTTP status, and map it in cachesvc_client.errors")
        cls.status = ERROR_CODES[cls.code]

    def __init__(self, message: str, details: Optional[Any] = None, headers: Optional[Mapping[str, str]] = None):
        super().__init__(message)
        self.message = message
        self.details = details
        self.headers = dict(headers or {})  # sent with the answer (a 429's Retry-After)


class InvalidRequest(CacheError):
    code = "invalid_request"


class Unauthorized(CacheError):
    code = "unauthorized"


class Forbidden(CacheError):
    code = "forbidden"


class NotFound(CacheError):
    code = "not_found"


class Conflict(CacheError):
    code = "conflict"


class BlobsMissing(CacheError):
    code = "blobs_missing"


class PayloadTooLarge(CacheError):
    code = "payload_too_large"


class UnsupportedMediaType(CacheError):
    code = "unsupported_media_type"


class RateLimited(CacheError):
    """Too many requests of a kind from one sender; ``headers`` carries the ``Retry-After`` (seconds)."""
    code = "rate_limited"


class Unavailable(CacheError):
    code = "unavailable"


def _body(code: str, message: str, details: Any = None):
    err = {"code": code, "message": message}
    if details is not None:
        err["details"] = details
    return {"error": err}


def _flatten(messages: Any, where: str = ""):
    """webargs' nested {location: {field: {index: [msgs]}}} as ("json.files.0.path", msg) pairs."""
    if isinstance(messages, dict):
        for k, v in messages.items():
            yield from _flatten(v, f"{where}.{k}" if where else str(k))
    elif isinstance(messages, list):
        for m in messages:
            yield from _flatten(m, where)
    else:
        yield where, str(messages)


def describe(exc: Exception) -> tuple:
    """(code, message, HTTP status, details) of a CacheError or an HTTPException: what the JSON
    body says, and what the HTML pages (``cachesvc.browse.signin``) show."""
    if isinstance(exc, CacheError):
        return exc.code, exc.message, exc.status, exc.details
    # flask-smorest / webargs put field errors in exc.data["messages"].
    data = getattr(exc, "data", None) or {}
    messages = data.get("messages")
    if messages is not None:
        problems = [f"{where}: {msg}" for where, msg in _flatten(messages)]
        msg = "invalid request: " + "; ".join(problems[:20]) if problems else "invalid request"
        return "invalid_request", msg, exc.code, messages
    return (exc.name or "error").lower().replace(" ", "_"), exc.description or exc.name, exc.code, None


def json_error(exc: Exception):
    """The JSON error response for a CacheError or an HTTPException."""
    code, message, status, details = describe(exc)
    headers = exc.headers if isinstance(exc, CacheError) else {}
    return jsonify(_body(code, message, details)), status, headers


def register(app: Flask, translate: Mapping[type, Callable[[Exception], CacheError]] = MappingProxyType({})) -> None:
    """The handlers of CacheError, Flask's HTTP errors and the database's failures; ``translate``: a
    lower layer's own exception types (storage's: ``cachesvc.app``), each answered as the CacheError
    its function makes of it. This module imports nothing of the layers above the database."""
    for exc_type, make in translate.items():
        app.register_error_handler(exc_type, lambda exc, make=make: json_error(make(exc)))
    app.register_error_handler(CacheError, json_error)
    app.register_error_handler(HTTPException, json_error)

    @app.errorhandler(OperationalError)
    @app.errorhandler(InterfaceError)
    def _db_error(exc: Exception):
        log.warning("database unavailable: %s", exc)
        return jsonify(_body("unavailable", "the database is unavailable; retry shortly")), 503

    @app.errorhandler(DBAPIError)
    def _db_disconnect(exc: DBAPIError):
        # A connection that broke mid-statement (the server restarted) can surface as another
        # DBAPIError subclass; SQLAlchemy flags it and drops the pool's stale connections.
        if not exc.connection_invalidated:
            raise exc
        return _db_error(exc)

    @app.errorhandler(RecursionError)
    def _too_deep(exc: RecursionError):
        # json.loads recurses once per nesting level, and webargs maps only JSONDecodeError to a 400:
        # '[' * 100000 would be a 500. Any other recursion is the service's own bug.
        if not request.is_json:
            raise exc
        return jsonify(_body("invalid_request", "the JSON body is nested too deeply")), 400

    @app.errorhandler(DataError)
    def _data_error(exc: DataError):
        # A value the database refuses to store or compare (PostgreSQL: NUL in text, a number out of
        # range) came from the request: the schemas let it through, but it is still the client's.
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else "invalid value"
        log.warning("database refused a value from the request: %s", reason)
        return jsonify(_body("invalid_request", f"the database refused a value in the request: {reason}")), 400
