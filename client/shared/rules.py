"""The wire rules the service and the client share, defined here only (standard library only).

The service imports them from ``cachesvc_client.shared.rules``, as it imports the key and path rules from
``cachesvc_client.shared.keys``, so the two sides cannot drift apart:

    ENCODINGS    how a blob is stored and sent: the service stores and accepts these, the client
                 decodes these and calls any other answer malformed
    MAX_WINDOW   the largest zstd window either side decodes (publishers' level 3 uses 2 MiB; a frame
                 asking for more is refused before zstd allocates it)
    stored_limit the most stored bytes either side reads for a blob of a declared size (so the
                 service never accepts a blob that every client would then refuse as oversize)
    ERROR_CODES  each ``{"error": {"code"}}`` the service answers -> its HTTP status; the service's
                 error classes take their status from it (``cachesvc.errors``) and the client maps every
                 code to an exception (``cachesvc_client.errors``); tests/test_shared_rules.py ties the three
"""
from __future__ import annotations

ENCODINGS = ("identity", "zstd")

MAX_WINDOW = 8 << 20


def stored_limit(encoding: str, size: int) -> int:
    """The most stored bytes an honest encoding of ``size`` decoded bytes takes: ``size`` itself for
    ``identity``; for ``zstd``, its worst case (incompressible data in raw blocks, plus frame headers
    every 2 MiB) with room to spare, so a stream that decodes to nothing cannot be fed for ever."""
    return size if encoding == "identity" else size + size // 64 + (64 << 10)

ERROR_CODES = {
    # the service's own (cachesvc.errors.CacheError subclasses)
    "invalid_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "blobs_missing": 409,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "rate_limited": 429,
    "unavailable": 503,
    # werkzeug's HTTP errors, answered under their names (cachesvc.errors.describe)
    "bad_request": 400,
    "request_entity_too_large": 413,
    "unprocessable_entity": 422,
}
