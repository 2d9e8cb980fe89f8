"""Inductor's live remote cache over HTTP: GET and PUT a value by Inductor's own key.

The environment fingerprint comes as query parameters (the six fields of a
resolve), so items of another torch, device or Python never mix. The body of
a PUT, and of a GET's answer, is the value's bytes.
"""
from __future__ import annotations

from flask import Response, request

from cachesvc_client.shared.keys import ENV_FIELDS, REMOTE_CACHES

from .. import content, metrics, remote_cache
from ..auth import requires
from ..errors import NotFound, PayloadTooLarge
from ..schemas import EnvSchema, ErrorSchema
from .answers import RemoteCacheItemSchema
from ..services import services
from . import Blueprint, body_limit

blp = Blueprint("remote_cache", __name__, url_prefix="/api/v1/remote-cache",
                description="Inductor's live remote cache (FX graphs, autotune results) by Inductor's key")

#: the header of every 200: the sha256 of the body, which the service checked; the client checks it too
SHA256_HEADER = "X-Cachesvc-Sha256"
_BINARY = {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}


def _env(args: dict) -> dict:
    return {f: args[f] for f in ENV_FIELDS}


def _count(cache: str, result: str) -> None:
    """Count a request; names outside ``REMOTE_CACHES`` share one label, so clients cannot grow the series."""
    metrics.current().remote_cache.labels(cache if cache in REMOTE_CACHES else "other", result).inc()


@blp.route("/<cache>/<key>", methods=["GET"])
@requires("read")
@blp.arguments(EnvSchema, location="query")
@blp.response(200, description="The value's bytes, checked by the service against the sha256 recorded at PUT; "
                                "header `X-Cachesvc-Sha256` is that sha256, for the client's own check",
              content_type="application/octet-stream")
@blp.alt_response(404, schema=ErrorSchema, description="No value under this key for this environment (a miss), "
                                                        "or its stored bytes are lost or not the value PUT")
def get(args, cache, key):
    """The value Inductor stored under `key` in `cache` for this environment; 404 `not_found` is a miss."""
    remote_cache.check_name(cache, key)
    svc = services()
    with content.storage_failures(), svc.db.session() as s:
        found = remote_cache.get(s, svc.storage, cache, _env(args), key)
    _count(cache, found.result)
    if found.value is None:
        raise NotFound(f"remote cache {cache} has no value for key {key} in this environment")
    metrics.current().bytes_out.labels("service").inc(len(found.value))
    return Response(found.value, mimetype="application/octet-stream",
                    headers={SHA256_HEADER: found.sha256})


@blp.route("/<cache>/<key>", methods=["PUT"])
@requires("write")
@body_limit(lambda settings: settings.REMOTE_CACHE_MAX_BYTES + 1, streamed=True)  # read_body answers past the limit itself
@blp.arguments(EnvSchema, location="query")
@blp.response(201, RemoteCacheItemSchema)
@blp.doc(requestBody={"required": True, **_BINARY})
def put(args, cache, key):
    """Store the body under `key` in `cache` for this environment (replacing an older value).

    413 `payload_too_large` beyond `CACHESVC_REMOTE_CACHE_MAX_BYTES`.
    """
    remote_cache.check_name(cache, key)
    svc = services()
    limit = svc.settings.REMOTE_CACHE_MAX_BYTES
    try:
        value = remote_cache.read_body(request, limit)
    except PayloadTooLarge:
        _count(cache, "too_large")
        raise
    with content.storage_failures(), svc.db.session() as s:
        item = remote_cache.put(s, svc.storage, cache, _env(args), key, value)
    _count(cache, "put")
    metrics.current().bytes_in.labels("service").inc(len(value))
    return item
