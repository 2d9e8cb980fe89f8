"""The client's exceptions, and the one place HTTP answers and transport failures become them.

The service answers errors as ``{"error": {"code", "message", "details"}}``;
``raise_for_response`` maps the code to a class (as huggingface_hub's
``hf_raise_for_status`` does), so callers catch meaning, not status numbers.
Anything else (an HTML 404 of a wrong URL, S3's XML) is summarised in one
line: status, content type, a short excerpt. ``describe_failure`` says in a
few words why a connection failed, naming the host and path but never the
query (it can be long, and a presigned one carries a signature).
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional
from urllib.parse import urlsplit

from . import answers


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


class RateLimited(CacheClientError):
    """The service took too many requests of this kind from this token or address (429; so far only usage
    reports are limited, per minute): send again after ``details["retry_after"]`` seconds."""


class IntegrityError(CacheClientError):
    """Bytes did not match their sha256 or their declared size, or a manifest broke the path rules."""


class MalformedAnswer(CacheClientError):
    """The service's answer broke its shape (``cachesvc_client.answers``): a miss, never a crash."""

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message, code="malformed_answer", status=status)


class HitRequired(CacheClientError):
    """A restore missed where a hit was required (``require_hit=True``, ``CACHESVC_REQUIRE_HIT=1``): the
    message says why it missed; ``report`` is the miss's RestoreReport."""

    def __init__(self, message: str, report: Any = None):
        super().__init__(message, code="hit_required")
        self.report = report


class Unsupported(CacheClientError):
    """The torch in this process cannot make or load this artifact; the message says why and what to do."""

    def __init__(self, message: str):
        super().__init__(message, code="unsupported")


class LoadFailed(CacheClientError):
    """torch raised while loading an artifact that passed every check."""

    def __init__(self, message: str):
        super().__init__(message, code="load_failed")


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
    "rate_limited": RateLimited,
    "unavailable": ServiceUnavailable,
}


class Answer:
    """An HTTP answer whose body was read with a bound: enough of a requests.Response for
    ``raise_for_response`` and for parsing."""

    def __init__(self, method: str, url: str, status: int, reason: str, headers: Mapping[str, str], body: bytes):
        self.method, self.url, self.status_code, self.reason = method, url, status, reason or ""
        self.headers, self.body = headers, body

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return answers.parse(self.body)


def where(url: str) -> str:
    """``http://host:port/path`` of ``url``: no query, no credentials."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return url.split("?", 1)[0][:200]
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{port}{parts.path}"


def excerpt(resp, limit: int = 120) -> str:
    """A non-cachesvc answer in one line: content type, size and the start of its text (tags dropped)."""
    body = getattr(resp, "body", None)
    if body is None:
        body = resp.content if hasattr(resp, "content") else b""
    ctype = (resp.headers.get("Content-Type") or "no content type").split(";")[0].strip()
    shown = body[:4096].decode("utf-8", "replace")
    if "html" in ctype or "xml" in ctype or shown.lstrip().startswith("<"):
        shown = re.sub(r"(?is)<(script|style)\b.*?(</\1>|$)|<!--.*?(-->|$)", " ", shown)  # not text anyone reads
        shown = re.sub(r"<[^>]*>", " ", shown)
    shown = " ".join(shown.split())
    shown = shown if len(shown) <= limit else shown[:limit - 3] + "..."
    return f"not a cachesvc answer: {ctype}, {len(body)} bytes" + (f": '{shown}'" if shown else "")


def describe_failure(exc: BaseException) -> str:
    """Why a request failed, in a few words (``connection refused``, ``timed out``), from the OS error
    or urllib3 error at the root of requests' and urllib3's wrappers."""
    seen, cur, root = set(), exc, exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        root = cur
        reason = getattr(cur, "reason", None)  # urllib3's MaxRetryError
        nxt = reason if isinstance(reason, BaseException) else None
        if nxt is None and cur.args and isinstance(cur.args[0], BaseException):  # requests' wrappers
            nxt = cur.args[0]
        cur = nxt or cur.__cause__ or cur.__context__
    name = type(root).__name__
    if isinstance(root, OSError) and root.strerror:
        return root.strerror[:1].lower() + root.strerror[1:]
    if "NameResolution" in name or "gaierror" in name:
        return "the host name does not resolve"
    if "Timeout" in name or isinstance(root, TimeoutError):
        return "timed out"
    text = re.sub(r"<[^>]*object at 0x[0-9a-f]+>:?\s*", "", str(root))
    text = re.sub(r"\(Caused by .*", "", text).strip()
    return f"{name}: {text[:200]}" if text else name


def raise_for_response(resp) -> None:
    """Raise the matching CacheClientError for a non-2xx ``requests.Response`` or ``Answer``."""
    if resp.status_code < 400:
        return
    method = getattr(resp, "method", None) or resp.request.method
    try:
        code, message, details = answers.error_fields(resp.json())
        text = f"{method} {where(resp.url)} -> {resp.status_code} {code}: {message}"
    except (ValueError, TypeError, RecursionError):  # answers.Malformed is a ValueError
        code, details = "error", None
        text = f"{method} {where(resp.url)} -> {resp.status_code} ({excerpt(resp)})"
    cls = ServiceUnavailable if resp.status_code >= 500 else _BY_CODE.get(code, CacheClientError)
    raise cls(text, code=code, status=resp.status_code, details=details)
