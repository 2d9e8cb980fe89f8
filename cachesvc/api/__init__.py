"""HTTP API, one blueprint per resource, all under /api/v1 (health at /healthz).

Every blueprint is this module's ``Blueprint``: flask-smorest's, with a parser that answers a JSON
body it cannot read with a 400 rather than a 500.
"""
import json

import flask_smorest
from flask import current_app, request
from webargs.flaskparser import FlaskParser

from cachesvc_client import keys

from ..errors import InvalidRequest, UnsupportedMediaType


class _Parser(FlaskParser):
    """webargs' parser, answering 400 for the bodies json.loads fails on with other errors than
    JSONDecodeError: nesting past the recursion limit (``"[" * 100000``) raises RecursionError and an
    integer of more than 4,300 digits ValueError; webargs maps only JSONDecodeError."""

    def _raw_load_json(self, req):
        try:
            return super()._raw_load_json(req)
        except json.JSONDecodeError:
            raise  # webargs' own 400 (and an empty body is no body)
        except RecursionError:
            raise InvalidRequest("the JSON body is nested too deeply") from None
        except ValueError as exc:
            reason = str(exc).split(":", 1)[0]  # "Exceeds the limit (4300 digits) for integer string conversion"
            raise InvalidRequest(f"the JSON body cannot be read: {reason}") from None


class Blueprint(flask_smorest.Blueprint):
    ARGUMENTS_PARSER = _Parser()

#: the OpenAPI request body of the byte-upload views (blobs, packs)
BINARY_BODY = {"required": True,
               "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}


def digest_arg(value: str) -> str:
    """A sha256 from the URL path, checked (400 otherwise)."""
    try:
        return keys.check_digest(value)
    except keys.InvalidKey as exc:
        raise InvalidRequest(str(exc)) from None


def services():
    """The app's Database, Storage and settings (set up by create_app)."""
    return current_app.extensions["cachesvc"]


def require_utf8_query() -> None:
    """``before_request`` hook: a query string that is not UTF-8 (a raw ``\\xff``) is a 400; werkzeug's
    ``request.args`` would raise UnicodeDecodeError (a 500) in whichever view or page read it first."""
    try:
        request.query_string.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"the query string is not valid UTF-8 (byte {exc.start}); percent-encode "
                             f"UTF-8 text") from None


def require_json_body() -> None:
    """``before_request`` hook: a view that reads a JSON body refuses a body of another type (415).

    webargs takes a body that is not ``application/json`` (or ``+json``) as absent, so without this a
    commit sent as text/plain would go ahead without its ``uploaded`` list, and a publish would be
    answered "key: missing" about a key that is there.
    """
    view = current_app.view_functions.get(request.endpoint)
    params = getattr(view, "_apidoc", {}).get("arguments", {}).get("parameters", [])
    has_body = bool(request.content_length) or "chunked" in request.headers.get("Transfer-Encoding", "")
    if has_body and not request.is_json and any(p.get("in") == "json" for p in params):
        raise UnsupportedMediaType(f"the body must be JSON: send Content-Type: application/json, "
                                   f"not {request.mimetype or 'none'}")
