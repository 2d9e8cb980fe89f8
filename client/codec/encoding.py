"""A blob's file and its stored encoding: hashing files, and choosing identity or zstd at publish (``encode``).

``encode`` re-hashes what it reads, so a file that changed after the manifest
was made is caught before the version is committed. The upload itself is
``transport.blobs.upload``; decoding at restore is ``decoding`` (bounded) and
``restore.download``.
"""
from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from typing import BinaryIO, Tuple

import zstandard

from . import frames
from ..errors import IntegrityError

CHUNK = 1 << 20
#: keep zstd only when it saves at least this fraction of the bytes
ZSTD_MIN_SAVING = 0.10
ZSTD_LEVEL = 3


def file_sha256(path: str) -> str:
    """The hex SHA-256 of a file, read in chunks."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            sha.update(chunk)
    return sha.hexdigest()


def encode(path: str, digest: str) -> Tuple[str, BinaryIO, int]:
    """Read ``path`` once: check its sha256 and choose identity or zstd.

    Returns (encoding, readable body positioned at 0, body length). Raises
    IntegrityError when the file no longer hashes to ``digest``.
    """
    sha = hashlib.sha256()
    packed = tempfile.SpooledTemporaryFile(max_size=32 << 20)
    size = 0
    with open(path, "rb") as src:
        if os.fstat(src.fileno()).st_size >= frames.FRAMED_MIN:
            # independent frames, so that restores can decode them on several threads
            def chunks():
                for chunk in iter(lambda: src.read(frames.FRAME_SIZE), b""):
                    sha.update(chunk)
                    yield chunk
            for frame in frames.compress_framed(chunks(), ZSTD_LEVEL):
                packed.write(frame)
            size = src.tell()
        else:
            with zstandard.ZstdCompressor(level=ZSTD_LEVEL).stream_writer(packed, closefd=False) as zw:
                while True:
                    chunk = src.read(CHUNK)
                    if not chunk:
                        break
                    sha.update(chunk)
                    zw.write(chunk)
                    size += len(chunk)
    if sha.hexdigest() != digest:
        packed.close()
        raise IntegrityError(f"{path} changed while publishing (sha256 differs from the manifest); "
                             "publish again after warm-up has finished")
    packed_size = packed.tell()
    if packed_size <= size * (1 - ZSTD_MIN_SAVING):
        packed.seek(0)
        return "zstd", packed, packed_size
    packed.close()
    return "identity", open(path, "rb"), size


def same_file(path: str, size: int, digest: str) -> bool:
    """True when ``path`` is a regular file with this size and sha256."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        return False
    return file_sha256(path) == digest
