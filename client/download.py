"""Downloading: one blob, or one run of a pack, from the service or storage into a temp file.

Downloads stream into a temp file in the target's own folder, hashing the
decoded bytes as they arrive; only a file whose sha256 matches is handed
back to be renamed into place, so nobody ever sees half a file. The temp
file is removed on every failure, before the failure is reported.

Everything received is untrusted: stored bytes are read up to what their
size allows and decoded with the bound of ``decoding`` (a bomb is refused
at its declared size plus one byte), error bodies up to 64 KiB, and every
request is cut off at the restore's ``Deadline`` whatever the server does
(``deadlines``). The bytes are taken as stored (``decode_content=False``):
a ``Content-Encoding`` set on a stored object is never decoded for us.

Large zstd blobs (``PIPELINE_MIN`` and up) whose stored bytes the service
vouches for (``stored_sha256``: the service decoded those very bytes and
checked their sha256 itself) are verified by hashing the ~7x smaller stored
bytes instead, plus the decoded size; when those do not match, the decoded
file is hashed in full, as for any other blob. Blobs published as several
small frames (``frames``) are decoded on a small thread pool.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import tempfile
import threading
from typing import BinaryIO, Callable, Optional, Tuple

import requests
import urllib3

from . import __version__, decoding, frames
from .deadlines import Deadline, guard_pools
from .errors import Answer, IntegrityError, ServiceUnavailable, describe_failure, raise_for_response
from .transfer import CHUNK, file_sha256

#: blobs at least this large (decoded) are hashed and written in a second thread
PIPELINE_MIN = 8 << 20
#: large blobs are decoded into this many reused buffers of this size
LARGE_BUFFERS = 6
LARGE_BUFFER = 4 << 20
#: an error answer is read up to this many bytes
ERROR_BODY = 64 << 10


class _HashingWriter:
    """Hash and write decoded chunks; for large blobs each in a thread of its own.

    Receiving and zstd-decoding happen in the caller's thread; sha256 and the
    file write (both release the GIL) run in two helper threads fed by small
    bounded queues, so the three overlap. For a 150 MB precompiled header on
    two cores this takes a restore from decode + hash + write in sequence to
    about the slowest of the three. Small blobs are handled inline: threads
    per file would cost more than they save.

    ``write(chunk, release)``: ``release()`` is called once both lanes are
    done with ``chunk``, so the caller can reuse its buffer.
    """

    _DONE = object()

    def __init__(self, out: BinaryIO, threaded: bool, hash_decoded: bool = True):
        self.out, self.sha, self.written = out, (hashlib.sha256() if hash_decoded else None), 0
        self.threaded = threaded
        self._error: Optional[BaseException] = None
        self._lanes = []
        self._lock = threading.Lock()
        self._pending: dict = {}
        if threaded:
            lanes = (("hash", self.sha.update),) if hash_decoded else ()
            for name, work in lanes + (("write", self.out.write),):
                q: queue.Queue = queue.Queue(maxsize=8)
                t = threading.Thread(target=self._drain, args=(q, work), name=f"cachesvc-{name}", daemon=True)
                t.start()
                self._lanes.append((q, t))

    def _drain(self, q: queue.Queue, work: Callable[[bytes], object]) -> None:
        while True:
            item = q.get()
            if item is self._DONE:
                return
            chunk, release = item
            if self._error is None:
                try:
                    work(chunk)
                except BaseException as exc:  # noqa: BLE001 - re-raised by write() or close()
                    self._error = exc
            if release is not None:
                with self._lock:
                    left = self._pending[id(item)] = self._pending.get(id(item), len(self._lanes)) - 1
                    if left == 0:
                        del self._pending[id(item)]
                if left == 0:
                    release()

    def write(self, chunk, release: Optional[Callable[[], None]] = None) -> None:
        if not len(chunk):
            if release is not None:
                release()
            return
        self.written += len(chunk)
        if not self._lanes:
            if self.sha is not None:
                self.sha.update(chunk)
            self.out.write(chunk)
            if release is not None:
                release()
            return
        if self._error is not None:
            raise self._error
        item = (chunk, release)
        for q, _t in self._lanes:
            q.put(item)

    def close(self) -> None:
        """Wait for the helper threads; re-raise what they failed with."""
        for q, t in self._lanes:
            q.put(self._DONE)
            t.join()
        self._lanes = []
        if self._error is not None:
            raise self._error




_POOLS: dict = {}
_POOL_LOCK = threading.Lock()


def _pool(url: str) -> urllib3.PoolManager:
    """The urllib3 pool for blob GETs to ``url`` (thread-safe, one per proxy setting; guarded: ``deadlines``).

    Blob downloads bypass requests.Session: its per-request work (settings
    merge, hooks, cookies, prepare) cost ~0.8 ms of CPU per GET against
    ~0.3 ms for urllib3 alone, which is most of a restore of thousands of
    small files on a small machine. What requests would take from the
    environment is kept: proxies (HTTP(S)_PROXY, NO_PROXY) and the CA bundle
    (REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, else certifi's).
    """
    proxy = requests.utils.get_environ_proxies(url).get(url.split(":", 1)[0])
    pool = _POOLS.get(proxy)
    if pool is None:
        with _POOL_LOCK:
            pool = _POOLS.get(proxy)
            if pool is None:
                kw = dict(num_pools=16, maxsize=32, retries=False, cert_reqs="CERT_REQUIRED",
                          ca_certs=(os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
                                    or requests.certs.where()),
                          headers={"User-Agent": f"cachesvc-client/{__version__}"})
                pool = guard_pools(urllib3.ProxyManager(proxy, **kw) if proxy else urllib3.PoolManager(**kw))
                _POOLS[proxy] = pool
    return pool


def _get(url: str, headers: dict, stall_timeout: float, deadline: Optional[Deadline], what: str,
         consume: Callable[[urllib3.BaseHTTPResponse], object]) -> object:
    """GET ``url`` and return ``consume(response)`` for a 2xx; the connection goes back to its pool only
    when the body was read to its end. Raises ServiceUnavailable (transfer failed or stalled for
    ``stall_timeout``), the CacheClientError of an error answer, and what ``consume`` raises."""
    resp = None
    with deadline.guard() if deadline is not None else contextlib.nullcontext():
        try:
            wait = stall_timeout if deadline is None else max(0.05, min(stall_timeout, deadline.left()))
            resp = _pool(url).request("GET", url, headers=headers, preload_content=False, decode_content=False,
                                      retries=False, timeout=urllib3.Timeout(connect=min(10.0, wait), read=wait))
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


def _cleanup(tmp: str, exc: BaseException, deadline: Optional[Deadline], what: str) -> None:
    """After a failed download: the temp file goes first; then, for a transfer cut off at the deadline,
    say so (whatever the cut-off read raised)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    if isinstance(exc, Exception) and deadline is not None:
        deadline.check(what)


def download(url: str, headers: dict, encoding: str, digest: str, size: int, dest_dir: str, stall_timeout: float,
             on_bytes: Callable[[int], None], deadline: Optional[Deadline] = None,
             stored_sha256: Optional[str] = None) -> str:
    """Fetch a blob into a new temp file in ``dest_dir`` and return its path.

    ``stored_sha256``: the sha256 of the stored (encoded) bytes, as the
    service recorded it after checking that they decode to ``digest``; for a
    large zstd blob the stored bytes are hashed instead of the decoded ones,
    and the decoded file is hashed only when that does not match.

    Raises IntegrityError when the bytes do not decode to ``size`` bytes
    hashing to ``digest`` (``decoding.Oversize`` past ``size``),
    ServiceUnavailable when the transfer fails, stalls for ``stall_timeout``
    or is still running at ``deadline``, another CacheClientError for an
    error answer, OSError for the local disk. The temp file is removed on
    any failure.
    """
    what = f"blob {digest[:12]}"
    fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=f".cachesvc-{os.getpid()}-", suffix=".tmp")
    stored_sha = hashlib.sha256() if (stored_sha256 and encoding == "zstd" and size >= PIPELINE_MIN) else None
    try:
        with os.fdopen(fd, "wb") as out:
            sink = _HashingWriter(out, threaded=size >= PIPELINE_MIN, hash_decoded=stored_sha is None)
            try:
                _get(url, headers, stall_timeout, deadline, what,
                     lambda resp: _decode(resp, sink, encoding, size, what, on_bytes, stored_sha))
            finally:
                sink.close()
        if stored_sha is not None and stored_sha.hexdigest() == stored_sha256:
            return tmp  # the very bytes the service verified, decoded to the expected length
        got = sink.sha.hexdigest() if sink.sha is not None else file_sha256(tmp)
        if got != digest:
            raise IntegrityError(f"{what}: its {size} bytes hash to {got[:12]}, expected {digest[:12]}")
        return tmp
    except BaseException as exc:
        _cleanup(tmp, exc, deadline, what)
        raise


class _Prefixed:
    """A readable that first hands out ``head``, then reads ``raw``."""

    def __init__(self, head: bytes, raw):
        self.head, self.raw = head, raw

    def read(self, n: int = -1) -> bytes:
        if self.head:
            data, self.head = (self.head, b"") if n < 0 or n >= len(self.head) else (self.head[:n], self.head[n:])
            return data
        return self.raw.read(n)

    def readinto(self, buf) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)


def _decode(resp, sink: _HashingWriter, encoding: str, size: int, what: str, on_bytes: Callable[[int], None],
            stored_sha=None) -> None:
    """Stream the stored bytes of ``resp`` through the bounded decoder into ``sink``.

    Large blobs decode into a few reused buffers (fresh multi-MB allocations for every chunk cost a
    page fault per 4 KiB in a new process: a third of a 150 MB restore), or frame-parallel when they
    were published as several small frames; small ones into one buffer, inline."""
    src = decoding.Limited(resp, decoding.stored_limit(encoding, size), what, on_bytes, stored_sha)
    try:
        if not sink.threaded:
            decoding.decode_into(src, encoding, size, what, sink.write, decoding.single_buffer(size))
            return
        if encoding == "zstd":
            head = src.read(18)  # the longest zstd frame header: enough to read the first frame's size
            if frames.parallel_ok(head):
                _decode_frames(src, head, sink, size, what)
                return
            src = _Prefixed(head, src)
        decoding.decode_into(src, encoding, size, what, sink.write, decoding.buffers(LARGE_BUFFERS, LARGE_BUFFER))
    except frames.FrameError as exc:
        raise IntegrityError(f"{what}: bad zstd data: {exc}") from None


def _decode_frames(src, head: bytes, sink: _HashingWriter, size: int, what: str) -> None:
    """Decode a stream of small independent frames on the shared decoder pool (``frames``)."""
    dec = frames.ParallelDecoder(sink.write, limit=size, what=what)
    try:
        dec.feed(head)
        while True:
            chunk = src.read(CHUNK)
            if not chunk:
                break
            dec.feed(chunk)
        dec.finish()
    finally:
        dec.close()
    if dec.declared != size:
        raise IntegrityError(f"{what}: its zstd frames decode to {dec.declared} bytes, expected {size}")


def fetch_bytes(url: str, headers: dict, byte_range: Optional[Tuple[int, int]], stall_timeout: float,
                on_bytes: Callable[[int], None], deadline: Optional[Deadline] = None, what: str = "pack",
                pack_size: Optional[int] = None) -> Tuple[bytes, int]:
    """GET ``url`` (a pack), the bytes ``[start, end)`` of ``byte_range`` or all of its ``pack_size`` bytes;
    return (data, the offset in the object where ``data`` starts). A server that ignores ``Range`` (200) is
    fine: the bytes before the range are skipped, those after it never read. Never reads more than the range
    (or ``pack_size``) into memory. Raises ServiceUnavailable (transfer failed, stalled, cut off at
    ``deadline``), IntegrityError (fewer bytes than asked for; more: ``decoding.Oversize``), another
    CacheClientError for an error answer."""
    if byte_range is not None:
        headers = {**headers, "Range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"}
    try:
        return _get(url, headers, stall_timeout, deadline, what,
                    lambda resp: _read_run(resp, byte_range, pack_size, on_bytes, what))
    except Exception:
        if deadline is not None:
            deadline.check(what)
        raise


def _read_run(resp, byte_range: Optional[Tuple[int, int]], pack_size: Optional[int],
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
    src = decoding.Limited(resp, end - base, what, on_bytes)
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


def write_member(data, encoding: str, digest: str, size: int, dest_dir: str) -> str:
    """Decode one pack member's stored bytes (bounded by ``size``), check its sha256, and write it to a new
    temp file in ``dest_dir``; return its path. Raises IntegrityError (nothing left behind), OSError."""
    what = f"blob {digest[:12]} (in its pack)"
    raw = decoding.decode_bytes(data, encoding, size, what)
    got = hashlib.sha256(raw).hexdigest()
    if got != digest:
        raise IntegrityError(f"{what}: decodes to {size} bytes hashing to {got[:12]}, expected {digest[:12]}")
    fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=f".cachesvc-{os.getpid()}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(raw)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp
