"""Storage: where the bytes live, and the only code that reads or writes them. It knows bytes and
keys only: what a blob or pack is, and what the index says of it, is ``cachesvc.content``'s (which
calls this), and nothing here imports the index, the database or the service's errors.

::

    Storage (this module)  the interface: a local folder (local.py) or any S3-compatible bucket (s3.py),
                           chosen by URL scheme (``from_url``); presigned URLs (presign.py)
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

import abc
import tempfile
from typing import BinaryIO, Dict, Iterator, Optional
from urllib.parse import urlparse

from cachesvc_client.shared.rules import ENCODINGS  # the shared rule (the client decodes these)

_SUFFIX = {"identity": "", "zstd": ".zst"}


class StorageError(Exception):
    """The backend failed (unreachable, denied, ...). Maps to 503."""


class BlobNotFound(StorageError):
    pass


class ShortObject(StorageError):
    """An object ends before the range asked for: it is not the object that was stored (replaced, or cut)."""


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


class Storage(abc.ABC):
    """Keys are '/'-separated strings relative to the backend's root/prefix.

    Implementations are thread-safe.
    """

    @abc.abstractmethod
    def put_file(self, key: str, path: str) -> None:
        """Store the file at ``path`` under ``key`` atomically; ``path`` is consumed (moved or deleted)."""

    @abc.abstractmethod
    def open(self, key: str) -> BinaryIO:
        """A readable stream of the object; raises BlobNotFound."""

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes of the object from ``offset``; raises BlobNotFound, ShortObject when the
        object is shorter, StorageError."""
        with self.open(key) as body:
            skip = offset
            while skip:
                got = body.read(min(skip, 1 << 20))
                if not got:
                    break
                skip -= len(got)
            data = body.read(length)
        if skip or len(data) != length:
            raise ShortObject(f"{key} is shorter than {offset} + {length} bytes")
        return data

    @abc.abstractmethod
    def stat(self, key: str) -> Optional[int]:
        """The object's size in bytes, or None when it does not exist."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; a missing object is not an error."""

    @abc.abstractmethod
    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        """Every key under ``prefix`` (for GC and tests)."""

    def check(self) -> None:
        """Raise StorageError unless the store answers (the readiness probe, ``/readyz``): one cheap
        real call, a listing of at most one key. Bounded by the caller: a hung store may block it."""
        next(iter(self.iter_keys("v1/")), None)

    def upload_target(self, key: str, expires: int, size: int) -> Optional[Dict]:
        """A presigned ``{"method", "url", "headers"}`` for a direct upload, or None
        when bytes must go through the service. ``size``: the body's length, signed into the URL
        (storage refuses a PUT of another length): every presigned upload is bounded."""
        return None

    def download_url(self, key: str, expires: int) -> Optional[str]:
        """A presigned GET URL, or None when bytes must go through the service."""
        return None

    def promote(self, src: str, dst: str) -> None:
        """Move object ``src`` to ``dst`` within the backend (an upload checked in its incoming place
        becomes the stored object). Raises BlobNotFound, StorageError. Only a backend whose
        ``upload_target`` presigns has incoming uploads to move."""
        raise NotImplementedError(f"{type(self).__name__} hands out no presigned uploads to move into place")

    def temp_dir(self) -> str:
        """Where uploads are received before ``put_file`` stores them: a folder on the objects' own
        filesystem where ``put_file`` renames (local), else the system's temp folder."""
        return tempfile.gettempdir()

    def sweep_incoming(self, older_than: float) -> int:
        """Remove uploads left half-received in ``temp_dir`` (a service killed mid-upload) older than
        ``older_than`` seconds; return how many. GC calls it with the upload lease. Nothing to sweep
        where ``temp_dir`` is the system's (its files die with the process's container)."""
        return 0

    def local_path(self, key: str) -> Optional[str]:
        """A filesystem path the service may send directly, if the backend has one."""
        return None


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
