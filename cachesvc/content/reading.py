"""Reading content for the views that serve it: a blob's stored bytes (loose, or its slice of a pack), a
pack whole or in ranges, and a remote-cache value checked against its sha256. Each lookup, object key
and storage failure is answered here, as the API's errors (404 ``not_found``, 503 ``unavailable``)."""
from __future__ import annotations

import contextlib
import hashlib
import io
from typing import BinaryIO, Dict, Iterator, NamedTuple, Optional, Tuple

from sqlalchemy import select

from ..db import Database
from ..errors import NotFound, Unavailable
from ..models import Blob, Pack
from ..storage import BlobNotFound, ShortObject, Storage, StorageError, blob_key, decoding, pack_key
from . import packs

CHUNK = 1 << 20


@contextlib.contextmanager
def storage_failures(what: str = "blob") -> Iterator[None]:
    """Storage's failure as a 503 ``unavailable`` naming ``what`` failed (blob or pack storage)."""
    try:
        yield
    except StorageError as exc:
        raise Unavailable(f"{what} storage failed: {exc}") from None


@contextlib.contextmanager
def _served(what: str, name: str) -> Iterator[None]:
    try:
        yield
    except BlobNotFound:
        raise NotFound(f"{what} {name} is indexed but missing from storage") from None
    except ShortObject:
        raise NotFound(f"{what} {name}: its pack in storage is shorter than recorded (damaged)") from None
    except StorageError as exc:
        raise Unavailable(f"{what} storage failed: {exc}") from None


def blob_url(storage: Storage, digest: str, encoding: str, expires: int) -> str:
    """Where a restore GETs loose blob ``digest``: a presigned URL, or the service's own."""
    return storage.download_url(blob_key(digest, encoding), expires) or f"/api/v1/blobs/{digest}"


class Stored(NamedTuple):
    """A blob's stored bytes to send: ``body`` (a file, or a stream), of which the row records ``length``
    bytes, and the headers saying how they are encoded."""

    body: BinaryIO
    length: int
    headers: Dict[str, str]


def open_blob(db: Database, storage: Storage, digest: str) -> Stored:
    """Blob ``digest``'s stored bytes: its object, or its slice of its pack (older clients know only the
    blob's URL). Raises NotFound (not stored, or its object lost or short), Unavailable."""
    with db.session() as s:
        blob = s.get(Blob, digest)
        if blob is None:
            raise NotFound(f"blob {digest} is not stored")
        s.expunge(blob)
    headers = {"X-Cachesvc-Encoding": blob.encoding, "X-Cachesvc-Size": str(blob.size)}
    with _served("blob", digest):
        if blob.pack_digest is not None:
            body: BinaryIO = io.BytesIO(packs.read_stored(storage, blob))
        else:
            body = storage.open(blob_key(digest, blob.encoding))
    return Stored(body, blob.stored_size, headers)


def chunks(body: BinaryIO, length: int) -> Iterator[bytes]:
    """``body`` in 1 MiB reads, cut at ``length`` bytes whatever the object holds now; closes it."""
    with body:
        left = length
        while left > 0:
            chunk = body.read(min(left, CHUNK))
            if not chunk:
                break
            left -= len(chunk)
            yield chunk


class StoredPack:
    """A recorded pack's object (``open_pack``): a local file to send whole, or its size and ranges."""

    def __init__(self, storage: Storage, digest: str):
        self.storage, self.digest, self.key = storage, digest, pack_key(digest)

    def local_file(self) -> Optional[BinaryIO]:
        """The pack's file when storage has one (sendfile, ranges from the file); None otherwise."""
        if self.storage.local_path(self.key) is None:
            return None
        with _served("pack", self.digest):
            return self.storage.open(self.key)

    def size(self) -> int:
        with _served("pack", self.digest):
            size = self.storage.stat(self.key)
            if size is None:
                raise BlobNotFound(self.key)
            return size

    def read(self, start: int, length: int) -> bytes:
        with _served("pack", self.digest):
            return self.storage.read_range(self.key, start, length)


def open_pack(db: Database, storage: Storage, digest: str) -> StoredPack:
    """Pack ``digest``, recorded. Raises NotFound when it is not."""
    with db.session() as s:
        if s.scalar(select(Pack.digest).where(Pack.digest == digest)) is None:
            raise NotFound(f"pack {digest} is not stored")
    return StoredPack(storage, digest)


def read_value(storage: Storage, blob: Blob, size: int) -> Tuple[Optional[bytes], str]:
    """(the value, "") when ``blob``'s stored bytes decode (bounded by ``size``) to ``size`` bytes hashing to
    ``blob.digest``; else (None, why: "lost", or "corrupt: ..."). Raises StorageError when storage fails."""
    try:
        value = decoding.decode_all(packs.read_stored(storage, blob), blob.encoding, size)
    except BlobNotFound:
        return None, "lost"
    except (decoding.BadBlob, ShortObject) as exc:
        return None, f"corrupt: {exc}"
    if len(value) != size or hashlib.sha256(value).hexdigest() != blob.digest:
        return None, f"corrupt: the stored bytes decode to {len(value)} bytes of other content"
    return value, ""
