"""Moving one blob: download-verify-place and compress-upload.

Downloads stream into a temp file in the target's own folder, hashing the
decoded bytes as they arrive; only a file whose sha256 matches is renamed
into place (``os.replace``), so nobody ever sees half a file. Uploads
re-hash what they read, so a file that changed after the manifest was made
is caught before the version is committed.
"""
from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from typing import BinaryIO, Callable, Optional, Tuple

import requests
import zstandard

from .errors import CacheClientError, IntegrityError, ServiceUnavailable, raise_for_response

CHUNK = 1 << 20
#: keep zstd only when it saves at least this fraction of the bytes
ZSTD_MIN_SAVING = 0.10
ZSTD_LEVEL = 3


def download(session: requests.Session, url: str, headers: dict, encoding: str, digest: str, size: int,
             dest_dir: str, stall_timeout: float, on_bytes: Callable[[int], None]) -> str:
    """Fetch a blob into a new temp file in ``dest_dir`` and return its path.

    Raises IntegrityError when the decoded bytes do not hash to ``digest``,
    ServiceUnavailable when the transfer fails or stalls for ``stall_timeout``.
    The temp file is removed on any failure.
    """
    fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=".cachesvc-", suffix=".tmp")
    try:
        sha = hashlib.sha256()
        written = 0
        with os.fdopen(fd, "wb") as out:
            try:
                resp = session.get(url, headers=headers, stream=True, timeout=(min(10.0, stall_timeout), stall_timeout))
                with resp:
                    raise_for_response(resp)
                    dec = zstandard.ZstdDecompressor().decompressobj() if encoding == "zstd" else None
                    for chunk in resp.iter_content(CHUNK):
                        on_bytes(len(chunk))
                        if dec is not None:
                            chunk = dec.decompress(chunk)
                        sha.update(chunk)
                        out.write(chunk)
                        written += len(chunk)
                    if dec is not None and not dec.eof:
                        raise IntegrityError(f"blob {digest[:12]}: zstd stream ended early")
            except (requests.ConnectionError, requests.Timeout) as exc:
                raise ServiceUnavailable(f"blob {digest[:12]}: transfer failed: {exc}") from None
            except zstandard.ZstdError as exc:
                raise IntegrityError(f"blob {digest[:12]}: bad zstd data: {exc}") from None
        if written != size or sha.hexdigest() != digest:
            raise IntegrityError(f"blob {digest[:12]}: got {written} bytes hashing to {sha.hexdigest()[:12]}, "
                                 f"expected {size} bytes with sha256 {digest[:12]}")
        return tmp
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def encode(path: str, digest: str) -> Tuple[str, BinaryIO, int]:
    """Read ``path`` once: check its sha256 and choose identity or zstd.

    Returns (encoding, readable body positioned at 0, body length). Raises
    IntegrityError when the file no longer hashes to ``digest``.
    """
    sha = hashlib.sha256()
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    packed = tempfile.SpooledTemporaryFile(max_size=32 << 20)
    size = 0
    with open(path, "rb") as src, cctx.stream_writer(packed, closefd=False) as zw:
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


def upload(session: requests.Session, target: dict, headers: dict, body: BinaryIO, length: int,
           timeout: float) -> None:
    """PUT ``body`` to an upload target from the service. Raises CacheClientError subclasses."""
    try:
        resp = session.request(target.get("method", "PUT"), target["url"], data=body,
                               headers={**target.get("headers", {}), **headers, "Content-Length": str(length)},
                               timeout=(min(10.0, timeout), timeout))
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise ServiceUnavailable(f"upload to {target['url'].split('?')[0]} failed: {exc}") from None
    if resp.status_code >= 400 and "X-Amz-Signature" in target["url"]:
        # S3 answers XML, not our JSON error shape.
        raise ServiceUnavailable(f"storage refused the upload: {resp.status_code} {resp.text[:300]}",
                                 status=resp.status_code)
    raise_for_response(resp)


def same_file(path: str, size: int, digest: str) -> bool:
    """True when ``path`` is a regular file with this size and sha256."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        return False
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            sha.update(chunk)
    return sha.hexdigest() == digest


