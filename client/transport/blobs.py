"""Blob bytes over HTTP: one GET (a blob, or a run of a pack) and one upload, to the service or its storage.

    get(transport, url, headers, stall_timeout=, deadline=, what=, consume=)   a GET whose 2xx body ``consume`` reads
    fetch_bytes(url, headers, byte_range, transport=, ...)                     a pack run, into memory, bounded
    upload(session, target, headers, body=, length=, timeout=)                 a PUT to an upload target

Everything received is untrusted: a body is read up to what its declared size
allows, error bodies up to 64 KiB (``ERROR_BODY``), and every request is cut
off at the restore's ``Deadline`` whatever the server does (``deadlines``).
The bytes are taken as stored (``decode_content=False``): a
``Content-Encoding`` set on a stored object is never decoded for us.
Decoding and verifying what arrived is the restore's (``restore.download``).
"""
from __future__ import annotations

import contextlib
from typing import BinaryIO, Callable, Optional, Tuple

import requests
import urllib3

from ..codec import decoding
from ..errors import Answer, IntegrityError, ServiceUnavailable, describe_failure, raise_for_response
from .deadlines import Deadline
from .session import CHUNK, Transport

#: an error answer is read up to this many bytes
ERROR_BODY = 64 << 10


def get(transport: Transport, url: str, headers: dict, *, stall_timeout: float, deadline: Optional[Deadline],
        what: str, consume: Callable[[urllib3.BaseHTTPResponse], object]) -> object:
    """GET ``url`` and return ``consume(response)`` for a 2xx; the connection goes back to its pool only
    when the body was read to its end. Raises ServiceUnavailable (transfer failed or stalled for
    ``stall_timeout``), the CacheClientError of an error answer, and what ``consume`` raises."""
    resp = None
    with deadline.guard() if deadline is not None else contextlib.nullcontext():
        try:
            wait = stall_timeout if deadline is None else max(0.05, min(stall_timeout, deadline.left()))
            resp = transport.blob_pool(url).request(
                "GET", url, headers=headers, preload_content=False, decode_content=False, retries=False,
                timeout=urllib3.Timeout(connect=min(10.0, wait), read=wait))
            if resp.status >= 400:
                raise_for_response(Answer("GET", url, resp.status, resp.reason, resp.headers, resp.read(ERROR_BODY)))
            out = consume(resp)
            if resp.closed:
                resp.release_conn()
                resp = None
            return out
        except urllib3.exceptions.HTTPError as exc:
            raise ServiceUnavailable(f"{what}: transfer failed: {describe_failure(exc)}") from None
        finally:
            if resp is not None:
                resp.close()  # not read to its end, or an error mid-body: this connection must not be reused


def fetch_bytes(url: str, headers: dict, byte_range: Optional[Tuple[int, int]], *, transport: Transport,
                stall_timeout: float, on_bytes: Callable[[int], None], deadline: Optional[Deadline] = None,
                what: str = "pack", pack_size: Optional[int] = None) -> Tuple[bytes, int]:
    """GET ``url`` (a pack), the bytes ``[start, end)`` of ``byte_range`` or all of its ``pack_size`` bytes;
    return (data, the offset in the object where ``data`` starts). A server that ignores ``Range`` (200) is
    fine: the bytes before the range are skipped, those after it never read. Never reads more than the range
    (or ``pack_size``) into memory. Raises ServiceUnavailable (transfer failed, stalled, cut off at
    ``deadline``), IntegrityError (fewer bytes than asked for; more: ``decoding.Oversize``), another
    CacheClientError for an error answer."""
    if byte_range is not None:
        headers = {**headers, "Range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"}
    try:
        return get(transport, url, headers, stall_timeout=stall_timeout, deadline=deadline, what=what,
                   consume=lambda resp: _read_run(resp, byte_range, pack_size, on_bytes=on_bytes, what=what))
    except Exception:
        if deadline is not None:
            deadline.check(what)
        raise


def _read_run(resp, byte_range: Optional[Tuple[int, int]], pack_size: Optional[int], *,
              on_bytes: Callable[[int], None], what: str) -> Tuple[bytes, int]:
    content_range = resp.headers.get("Content-Range")
    # Where the bytes start: Content-Range says (some S3 servers send it with a 200), else a 206 is the
    # range asked for, else the server ignored Range and sent it all.
    base = _range_start(content_range) if content_range else (
        byte_range[0] if byte_range is not None and resp.status == 206 else 0)
    start, end = byte_range if byte_range is not None else (0, pack_size)
    if end is None:
        raise IntegrityError(f"{what}: its size is unknown; fetch it by ranges")
    if base > start:
        raise IntegrityError(f"{what}: the answer starts at byte {base}, after the wanted {start}")
    src = decoding.Limited(resp, end - base, what, on_bytes=on_bytes)
    _skip(src, start - base)  # a server that ignored Range: skip to the run
    data = _read_exactly(src, end - start)
    if len(data) < end - start:
        raise IntegrityError(f"{what}: got {len(data)} bytes from offset {start}, wanted up to {end}")
    if byte_range is None or resp.status == 206:
        src.read(1)  # the answer should end here; one byte more is Oversize
    return data, start


def _skip(src, n: int) -> None:
    while n > 0:
        got = len(src.read(min(n, CHUNK)))
        if not got:
            return
        n -= got


def _read_exactly(src, n: int) -> bytes:
    """Up to ``n`` bytes from ``src`` (fewer at its end)."""
    out = bytearray(n)
    view, got = memoryview(out), 0
    while got < n:
        k = src.readinto(view[got:got + CHUNK])
        if not k:
            break
        got += k
    del view
    return bytes(out) if got == n else bytes(out[:got])


def _range_start(content_range: str) -> int:
    """The first byte's offset from a ``Content-Range: bytes <first>-<last>/<size>`` header."""
    try:
        return int(content_range.split()[1].split("-")[0])
    except (IndexError, ValueError):
        raise IntegrityError(f"unreadable Content-Range {content_range!r}") from None


def upload(session: requests.Session, target: dict, headers: dict, *, body: BinaryIO, length: int,
           timeout: float) -> None:
    """PUT ``body`` to an upload target from the service. Raises CacheClientError subclasses."""
    try:
        resp = session.request(target.get("method", "PUT"), target["url"], data=body,
                               headers={**target.get("headers", {}), **headers, "Content-Length": str(length)},
                               timeout=(min(10.0, timeout), timeout))
    except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
        # a server killed while answering cuts its reply short (ChunkedEncodingError): unavailable, as a refused
        # connection is, never an unexpected error
        raise ServiceUnavailable(f"upload to {target['url'].split('?')[0]} failed: {exc}") from None
    if resp.status_code >= 400 and "X-Amz-Signature" in target["url"]:
        # S3 answers XML, not our JSON error shape.
        raise ServiceUnavailable(f"storage refused the upload: {resp.status_code} {resp.text[:300]}",
                                 status=resp.status_code)
    raise_for_response(resp)
