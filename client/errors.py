"""The client's exceptions, and the one place HTTP answers become them.

The service answers errors as ``{"error": {"code", "message", "details"}}``;
``raise_for_response`` maps the code to a class (as huggingface_hub's
``hf_raise_for_status`` does), so callers catch meaning, not status numbers.
"""
from __future__ import annotations

from typing import Any, Optional


class CacheClientError(Exception):
    """Base class. ``code`` is the service's error code, ``status`` the HTTP status (None if no answer)."""

    def __init__(self, message: str, code: str = "error", status: Optional[int] = None, details: Any = None):
        super().__init__(message)
        self.message, self.code, self.status, self.details = message, code, status, details


class ServiceUnavailable(CacheClientError):
    """The service or its storage could not be reached or answered 5xx. Retry later."""


class InvalidRequest(CacheClientError):
    pass


class Unauthorized(CacheClientError):
    pass


class Forbidden(CacheClientError):
    pass


class NotFound(CacheClientError):
    pass


class Conflict(CacheClientError):
    pass


class BlobsMissing(Conflict):
    pass


class IntegrityError(CacheClientError):
    """Bytes did not match their sha256, or a manifest broke the path rules."""


_BY_CODE = {
    "invalid_request": InvalidRequest,
    "unprocessable_entity": InvalidRequest,
    "bad_request": InvalidRequest,
    "payload_too_large": InvalidRequest,
    "request_entity_too_large": InvalidRequest,
    "unsupported_media_type": InvalidRequest,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "conflict": Conflict,
    "blobs_missing": BlobsMissing,
    "unavailable": ServiceUnavailable,
}


def raise_for_response(resp) -> None:
    """Raise the matching CacheClientError for a non-2xx ``requests.Response``."""
    if resp.status_code < 400:
        return
    try:
        err = resp.json()["error"]
        code, message, details = err.get("code", "error"), err.get("message", ""), err.get("details")
    except (ValueError, KeyError, TypeError):
        code, message, details = "error", (resp.text or resp.reason or "")[:500], None
    if resp.status_code >= 500:
        cls = ServiceUnavailable
    else:
        cls = _BY_CODE.get(code, CacheClientError)
    raise cls(f"{resp.request.method} {resp.url.split('?')[0]} -> {resp.status_code} {code}: {message}",
              code=code, status=resp.status_code, details=details)
