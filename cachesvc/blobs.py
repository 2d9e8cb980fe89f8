"""Receive a blob through the service (local backend, or S3 with presigning off).

The body is streamed to a temp file while its sha256 is computed over the
*decoded* bytes; only a body whose digest matches is handed to storage, so a
bad upload leaves nothing behind (validate first, then write).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from typing import BinaryIO

import zstandard

from .errors import InvalidRequest
from .storage import Storage, blob_key

CHUNK = 1 << 20


def receive(storage: Storage, digest: str, encoding: str, body: BinaryIO) -> dict:
    """Store ``body`` as blob ``digest``; return its row values. Raises InvalidRequest."""
    tmp_dir = getattr(storage, "temp_dir", tempfile.gettempdir)()
    fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix=".upload-")
    sha = hashlib.sha256()
    size = stored = 0
    try:
        with os.fdopen(fd, "wb") as out:
            dec = zstandard.ZstdDecompressor().decompressobj() if encoding == "zstd" else None
            while True:
                chunk = body.read(CHUNK)
                if not chunk:
                    break
                out.write(chunk)
                stored += len(chunk)
                if dec is not None:
                    try:
                        chunk = dec.decompress(chunk)
                    except zstandard.ZstdError as exc:
                        raise InvalidRequest(f"body is not a valid zstd stream: {exc}") from None
                sha.update(chunk)
                size += len(chunk)
            if dec is not None and not dec.eof:
                raise InvalidRequest("zstd stream is truncated")
        if sha.hexdigest() != digest:
            raise InvalidRequest(f"body hashes to sha256 {sha.hexdigest()}, not {digest}; nothing was stored",
                                 {"expected": digest, "actual": sha.hexdigest()})
        storage.put_file(blob_key(digest, encoding), tmp)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return {"digest": digest, "size": size, "stored_size": stored, "encoding": encoding}
