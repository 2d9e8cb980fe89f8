"""Storage's types: the ``Storage`` interface and the errors every backend raises. The rooms that
hold a store without reading or writing it themselves (publish, resolve, lifecycle, the remote cache)
import these and nothing else of ``cachesvc.storage`` (``tests/test_layers.py``): what they do with the
bytes goes through ``cachesvc.content``. Re-exported by ``cachesvc.storage``.
"""
from __future__ import annotations

import abc
import tempfile
from typing import BinaryIO, Dict, Iterator, Optional


class StorageError(Exception):
    """The backend failed (unreachable, denied, ...). Maps to 503."""


class BlobNotFound(StorageError):
    pass


class ShortObject(StorageError):
    """An object ends before the range asked for: it is not the object that was stored (replaced, or cut)."""


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
