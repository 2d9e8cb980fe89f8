"""HTTP API, one blueprint per resource, all under /api/v1 (health at /healthz)."""
from flask import current_app, request

from cachesvc_client import keys

from ..errors import InvalidRequest, UnsupportedMediaType

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
