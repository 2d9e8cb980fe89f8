"""Storage: where the bytes live, and the only code that reads or writes them. It knows bytes and
keys only: what a blob or pack is, and what the index says of it, is ``cachesvc.content``'s (which
calls this), and nothing here imports the index, the database or the service's errors.

::

    Storage (types.py)     the interface, and the errors every backend raises: a local folder (local.py)
                           or any S3-compatible bucket (s3.py), chosen by URL scheme (``from_url``, this
                           module); presigned URLs (presign.py)
    decoding.py            the one bounded decoder of stored bytes (a bomb is a refusal, not an OOM)

Object layout (the same on both backends)::

    [<prefix>/]v1/blobs/<sha256[:2]>/<sha256>        identity encoding
    [<prefix>/]v1/blobs/<sha256[:2]>/<sha256>.zst    zstd frame(s) of the same bytes
    [<prefix>/]v1/packs/<sha256[:2]>/<sha256>        a pack: small blobs' stored bytes, concatenated
    [<prefix>/]v1/incoming/<version id>/<key>        a presigned upload, until its version's commit checks
                                                     it and moves it to <key> (``incoming_key``); GC deletes
                                                     what no commit will take

A pack is named by the sha256 of its own bytes; where each member lies in it
(offset, stored size, encoding) is in the index (``cachesvc.content.packs``).

The sha256 is always that of the *uncompressed* content, so a blob keeps its
name whatever encoding the publisher chose. ``v1`` leaves room to change the
layout later. Backends raise only ``StorageError`` / ``BlobNotFound``; no
botocore type leaves this package.
"""
from __future__ import annotations

from typing import Dict, Optional
from urllib.parse import urlparse

from cachesvc_client.shared.rules import ENCODINGS  # the shared rule (the client decodes these)

from .types import BlobNotFound, ShortObject, Storage, StorageError

__all__ = ["ENCODINGS", "INCOMING", "BlobNotFound", "ShortObject", "Storage", "StorageError", "blob_key",
           "from_url", "incoming_key", "pack_key"]

_SUFFIX = {"identity": "", "zstd": ".zst"}


def blob_key(digest: str, encoding: str) -> str:
    """Object key of a blob, relative to the backend's prefix."""
    return f"v1/blobs/{digest[:2]}/{digest}{_SUFFIX[encoding]}"


def pack_key(digest: str) -> str:
    """Object key of a pack, relative to the backend's prefix."""
    return f"v1/packs/{digest[:2]}/{digest}"


#: where presigned uploads land: a pending version's own folder, never a committed object's key
INCOMING = "v1/incoming/"


def incoming_key(version_id: int, key: str) -> str:
    """Where pending version ``version_id`` uploads object ``key`` (a blob_key or pack_key) by a presigned
    PUT. Commit checks it there and only then moves it to ``key``, so a presigned URL (valid for
    ``PRESIGN_EXPIRES`` after the commit too) can never write the bytes a committed version names."""
    return f"{INCOMING}{version_id}/{key}"


def from_url(url: str, settings: Optional[Dict] = None) -> Storage:
    """Build the backend named by ``url``: ``file:///dir`` or ``s3://bucket[/prefix]``."""
    settings = settings or {}
    parsed = urlparse(url)
    if parsed.scheme == "file":
        from .local import LocalStorage

        return LocalStorage(parsed.path)
    if parsed.scheme == "s3":
        from .s3 import S3Storage

        return S3Storage(
            bucket=parsed.netloc,
            prefix=parsed.path.strip("/"),
            endpoint_url=settings.get("S3_ENDPOINT_URL") or None,
            region=settings.get("S3_REGION") or "us-east-1",
            access_key=settings.get("S3_ACCESS_KEY_ID") or None,
            secret_key=settings.get("S3_SECRET_ACCESS_KEY") or None,
            presign=settings.get("S3_PRESIGN", True),
            public_endpoint_url=settings.get("S3_PUBLIC_ENDPOINT_URL") or None,
        )
    raise ValueError(f"unsupported storage URL {url!r}: use file:///path or s3://bucket/prefix")
