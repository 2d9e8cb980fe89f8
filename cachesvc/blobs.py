"""Receive and check blob bytes: the body of a PUT through the service, or an object uploaded
straight to storage (presigned) and read back at commit.

A body is streamed to a temp file while its sha256 is computed over the
*decoded* bytes; only a body whose digest matches is handed to storage, so a
bad upload leaves nothing behind (validate first, then write). A zstd body
may be several concatenated frames (large blobs are published that way so
that restores decode them in parallel); every frame is decoded.

Having decoded the stored bytes itself, the service records their own sha256
(``stored_sha256``): a restoring client that finds the stored bytes hash to it
knows they decode to the blob without hashing the decoded bytes (docs/security.md,
"Security").
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from typing import BinaryIO, Optional

import zstandard

from .errors import InvalidRequest
from .storage import BlobNotFound, Storage, blob_key

CHUNK = 1 << 20
#: objects uploaded straight to storage at least this large (decoded) are read back and checked at
#: commit, so their stored_sha256 can be recorded; smaller ones are hashed by the restoring client
VERIFY_AT_COMMIT_MIN = 8 << 20


class BadBlob(ValueError):
    """The bytes are not a valid encoding of the blob (the message says why; ``details`` for the answer)."""

    def __init__(self, message: str, details: Optional[dict] = None):
        super().__init__(message)
        self.details = details


class Frames:
    """Decode a zstd stream of one or more concatenated frames, chunk by chunk.

    ``decode(chunk)`` returns the decoded bytes of ``chunk``; ``eof`` is True
    when the input so far ends exactly at the end of a frame. Raises BadBlob.
    """

    def __init__(self):
        self._dctx = zstandard.ZstdDecompressor()
        self._dec = self._dctx.decompressobj()
        self._started = False

    def decode(self, chunk: bytes) -> bytes:
        out = []
        try:
            while chunk:
                if self._dec.eof:
                    self._dec = self._dctx.decompressobj()
                self._started = True
                out.append(self._dec.decompress(chunk))
                chunk = self._dec.unused_data if self._dec.eof else b""
        except zstandard.ZstdError as exc:
            raise BadBlob(f"body is not a valid zstd stream: {exc}") from None
        return b"".join(out)

    @property
    def eof(self) -> bool:
        return self._started and self._dec.eof


def decode_all(raw: bytes) -> bytes:
    """The decoded bytes of a whole zstd stream (one frame or several). Raises BadBlob."""
    dec = Frames()
    out = dec.decode(raw)
    if not dec.eof:
        raise BadBlob("zstd stream is truncated")
    return out


class _Check:
    """sha256 of the stored bytes and of the decoded bytes, fed in order."""

    def __init__(self, encoding: str):
        self.dec = Frames() if encoding == "zstd" else None
        self.sha, self.stored_sha = hashlib.sha256(), hashlib.sha256()
        self.size = self.stored = 0

    def update(self, chunk: bytes) -> None:
        self.stored_sha.update(chunk)
        self.stored += len(chunk)
        if self.dec is not None:
            chunk = self.dec.decode(chunk)
        self.sha.update(chunk)
        self.size += len(chunk)

    def result(self, digest: str, encoding: str) -> dict:
        if self.dec is not None and not self.dec.eof:
            raise BadBlob("zstd stream is truncated")
        if self.sha.hexdigest() != digest:
            raise BadBlob(f"body hashes to sha256 {self.sha.hexdigest()}, not {digest}; nothing was stored",
                          {"expected": digest, "actual": self.sha.hexdigest()})
        return {"digest": digest, "size": self.size, "stored_size": self.stored, "encoding": encoding,
                "stored_sha256": self.stored_sha.hexdigest()}


def receive(storage: Storage, digest: str, encoding: str, body: BinaryIO) -> dict:
    """Store ``body`` as blob ``digest``; return its row values. Raises InvalidRequest."""
    tmp_dir = getattr(storage, "temp_dir", tempfile.gettempdir)()
    fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix=".upload-")
    check = _Check(encoding)
    try:
        with os.fdopen(fd, "wb") as out:
            while True:
                chunk = body.read(CHUNK)
                if not chunk:
                    break
                out.write(chunk)
                check.update(chunk)
        row = check.result(digest, encoding)
        storage.put_file(blob_key(digest, encoding), tmp)
    except BadBlob as exc:
        raise InvalidRequest(str(exc), exc.details) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return row


def check_stored(storage: Storage, digest: str, encoding: str) -> Optional[str]:
    """Read blob ``digest`` back from storage and check that it decodes to ``digest``.

    Returns the sha256 of the stored bytes; None when the object is gone.
    Raises BadBlob when it does not decode to the blob, StorageError when
    storage fails.
    """
    check = _Check(encoding)
    try:
        with storage.open(blob_key(digest, encoding)) as body:
            for chunk in iter(lambda: body.read(CHUNK), b""):
                check.update(chunk)
    except BlobNotFound:
        return None
    return check.result(digest, encoding)["stored_sha256"]
