"""HTTP API, one blueprint per resource, all under /api/v1 (health at /healthz).

Every blueprint is this module's ``Blueprint``: flask-smorest's, with a parser that answers a JSON
body it cannot read with a 400 rather than a 500.
"""
import io
import json
import re
from typing import Callable, Dict, Union

import flask_smorest
from flask import current_app, request
from webargs.flaskparser import FlaskParser

from cachesvc_client.shared import keys

from ..errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType
from ..config import Settings
from ..services import services


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


def body_limit(limit: Union[int, str, Callable[[dict], int]], streamed: bool = False) -> Callable:
    """Declare the largest body a view takes: bytes, a size setting's name, or a function of the
    settings. Enforced by ``check_body_size``; a view without one takes ``BODY_LIMIT_BYTES``.
    ``streamed``: the view reads its body as a stream (blob bytes) and checks what it reads itself."""
    def deco(view):
        view._cachesvc_body_limit = limit
        view._cachesvc_body_streamed = streamed
        return view
    return deco


def _route_limit(settings: Settings, view) -> tuple[int, str]:
    """The body limit of the request's route, and the setting that sets it ("" when fixed)."""
    limit = getattr(view, "_cachesvc_body_limit", "BODY_LIMIT_BYTES")
    if isinstance(limit, str):
        return int(getattr(settings, limit)), f" (CACHESVC_{limit})"
    return (int(limit(settings)) if callable(limit) else int(limit)), ""


#: how a URL rule's converters read as a regular expression (nginx's PCRE), for ``route_limits``
_CONVERTER_PATTERNS = {"int": "[0-9]+", "path": ".+"}
#: a variable of a URL rule (``<sha256>``, ``<int:version_id>``), capturing its converter's name
_VARIABLE = re.compile(r"<(?:([a-zA-Z_]\w*)(?:\([^)]*\))?:)?[a-zA-Z_]\w*>")


def route_limits(app) -> Dict[str, int]:
    """The body limit of every URL rule of ``app`` as ``{anchored path regex: bytes}``: the largest limit
    of the rule's views (one path may take a PUT of blob bytes and a body-less GET). The buffering proxy
    in front refuses past these before the app sees a byte (``cachesvc.cli.proxy``): the same table as
    ``check_body_size``'s, so nginx never forwards a body the app would refuse unread (such a refusal,
    answered while nginx was still sending, came back as a 502)."""
    settings = app.extensions["cachesvc"].settings
    limits: Dict[str, int] = {}
    for rule in app.url_map.iter_rules():
        pieces = _VARIABLE.split(rule.rule)  # literal, converter, literal, converter, ..., literal
        path = "".join(re.escape(p) if i % 2 == 0 else _CONVERTER_PATTERNS.get(p or "default", "[^/]+")
                       for i, p in enumerate(pieces))
        limit = _route_limit(settings, app.view_functions.get(rule.endpoint))[0]
        regex = f"^{path}$"
        limits[regex] = max(limit, limits.get(regex, 0))
    return limits


def check_body_size() -> None:
    """``before_request`` hook, the first: the route's body limit, before anything reads the body.

    A Content-Length past it is a 413 at once, with the body unread (a 63 MiB sign-in form costs its
    headers, not 3 GB of parsed form). A chunked body (no length) is read here up to the limit and
    refused past it, then parsed from memory; a streamed view's (blob bytes) is read through a stream
    that stops at its limit (werkzeug's ``max_content_length``: 413 there).
    """
    view = current_app.view_functions.get(request.endpoint)
    limit, setting = _route_limit(services().settings, view)
    request.max_content_length = limit
    request.max_form_memory_size = limit
    too_large = f"this route takes a body of at most {limit} bytes{setting}"
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"the body is {request.content_length} bytes; {too_large}")
    environ = request.environ
    if request.content_length is None and environ.get("wsgi.input_terminated") and \
            not getattr(view, "_cachesvc_body_streamed", False):
        data = _read_at_most(environ["wsgi.input"], limit + 1)
        if len(data) > limit:
            raise PayloadTooLarge(f"the chunked body is longer than {limit} bytes; {too_large}")
        environ.update({"wsgi.input": io.BytesIO(data), "CONTENT_LENGTH": str(len(data))})
        environ.pop("HTTP_TRANSFER_ENCODING", None)


def _read_at_most(stream, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = stream.read(min(n - got, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


#: every response's security headers: no framing (a same-site page framing "Yes, purge"), no sniffing, and
#: a CSP with no inline script or style (the pages and Swagger UI load theirs from the service)
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def add_security_headers(response):
    """``after_request`` hook: SECURITY_HEADERS on every answer, page, API, error or asset alike."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def json_limit(largest: object) -> int:
    """The body limit of a JSON route from the largest valid request its schema allows (built from the
    schema's own bounds): twice its size as json.dumps writes it (room for indentation), plus 1 KiB."""
    return 2 * len(json.dumps(largest)) + 1024
