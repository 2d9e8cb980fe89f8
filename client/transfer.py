"""Moving one blob: download-verify-place and compress-upload.

Downloads stream into a temp file in the target's own folder, hashing the
decoded bytes as they arrive; only a file whose sha256 matches is renamed
into place (``os.replace``), so nobody ever sees half a file. Uploads
re-hash what they read, so a file that changed after the manifest was made
is caught before the version is committed.

Large zstd blobs (``PIPELINE_MIN`` and up) whose stored bytes the service
vouches for (``stored_sha256``: the service decoded those very bytes and
checked their sha256 itself) are verified by hashing the ~7x smaller stored
bytes instead, plus the decoded size; when those do not match, the decoded
file is hashed in full, as for any other blob. Blobs published as several
small frames (``frames``) are decoded on a small thread pool.
"""
from __future__ import annotations

import hashlib
import os
import queue
import stat
import tempfile
import threading
import time
from typing import BinaryIO, Callable, Optional, Tuple

import requests
import urllib3
import zstandard

from . import __version__, frames
from .errors import IntegrityError, ServiceUnavailable, raise_for_response

CHUNK = 1 << 20
#: keep zstd only when it saves at least this fraction of the bytes
ZSTD_MIN_SAVING = 0.10
ZSTD_LEVEL = 3
#: blobs at least this large (decoded) are hashed and written in a second thread
PIPELINE_MIN = 8 << 20
#: large blobs are decoded into this many reused buffers of this size
LARGE_BUFFERS = 6
LARGE_BUFFER = 4 << 20


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


class _Counted:
    """A readable that reports how many bytes it handed out (progress) and hashes them into ``sha``."""

    def __init__(self, raw, on_bytes: Callable[[int], None], sha=None):
        self.raw, self.on_bytes, self.sha = raw, on_bytes, sha

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.on_bytes(len(data))
        if self.sha is not None:
            self.sha.update(data)
        return data

    def readinto(self, buf) -> int:
        n = self.raw.readinto(buf)
        self.on_bytes(n)
        if self.sha is not None:
            self.sha.update(memoryview(buf)[:n])
        return n


_POOLS: dict = {}
_POOL_LOCK = threading.Lock()


def _pool(url: str) -> urllib3.PoolManager:
    """The urllib3 pool for blob GETs to ``url`` (thread-safe, one per proxy setting).

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
                pool = urllib3.ProxyManager(proxy, **kw) if proxy else urllib3.PoolManager(**kw)
                _POOLS[proxy] = pool
    return pool


class _ErrorView:
    """Enough of a requests.Response for ``raise_for_response`` to read an error answer."""

    def __init__(self, method: str, url: str, status: int, reason: str, body: bytes):
        self.status_code, self.reason, self.url, self._body = status, reason or "", url, body
        self.request = type("_Request", (), {"method": method})()

    @property
    def text(self) -> str:
        return self._body.decode("utf-8", "replace")

    def json(self):
        import json

        return json.loads(self._body)


class Cutoff:
    """Ends every transfer still running at ``deadline`` (``time.monotonic()``; None: never): a
    server that trickles bytes never trips a read timeout, and must not hold a container start.

    One timer for a whole restore (a timer per blob cost ~0.3 ms each, as much as a small GET):
    at the deadline it shuts down the sockets of the responses registered with it, under the
    threads reading them. Thread-safe; a context manager (the timer stops on the way out).
    """

    def __init__(self, deadline: Optional[float]):
        self.deadline = deadline
        self._live: set = set()
        self._lock = threading.Lock()
        self._fired = False
        self._timer = None
        if deadline is not None:
            self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
            self._timer.daemon = True
            self._timer.start()

    def __enter__(self) -> "Cutoff":
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _fire(self) -> None:
        with self._lock:
            self._fired = True
            live = list(self._live)
        for resp in live:
            resp.shutdown()

    def add(self, resp) -> None:
        with self._lock:
            self._live.add(resp)
            fired = self._fired
        if fired:
            resp.shutdown()

    def discard(self, resp) -> None:
        with self._lock:
            self._live.discard(resp)


def download(url: str, headers: dict, encoding: str, digest: str, size: int, dest_dir: str, stall_timeout: float,
             on_bytes: Callable[[int], None], cutoff: Optional[Cutoff] = None,
             stored_sha256: Optional[str] = None) -> str:
    """Fetch a blob into a new temp file in ``dest_dir`` and return its path.

    ``stored_sha256``: the sha256 of the stored (encoded) bytes, as the
    service recorded it after checking that they decode to ``digest``; for a
    large zstd blob the stored bytes are hashed instead of the decoded ones,
    and the decoded file is hashed only when that does not match.

    Raises IntegrityError when the decoded bytes do not hash to ``digest``,
    ServiceUnavailable when the transfer fails, stalls for ``stall_timeout``
    or is still running at ``cutoff.deadline``, another CacheClientError for
    an error answer. The temp file is removed on any failure.
    """
    deadline = cutoff.deadline if cutoff is not None else None  # for the messages
    fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=f".cachesvc-{os.getpid()}-", suffix=".tmp")
    stored_sha = hashlib.sha256() if (stored_sha256 and encoding == "zstd" and size >= PIPELINE_MIN) else None
    try:
        with os.fdopen(fd, "wb") as out:
            sink = _HashingWriter(out, threaded=size >= PIPELINE_MIN, hash_decoded=stored_sha is None)
            try:
                _fetch_into(sink, url, headers, encoding, digest, stall_timeout, on_bytes, cutoff, stored_sha)
            finally:
                sink.close()
        written = sink.written
        if stored_sha is not None and written == size and stored_sha.hexdigest() == stored_sha256:
            return tmp  # the very bytes the service verified, decoded to the expected length
        got = sink.sha.hexdigest() if sink.sha is not None else (file_sha256(tmp) if written == size else "")
        if written != size or got != digest:
            raise IntegrityError(f"blob {digest[:12]}: got {written} bytes hashing to {got[:12]}, "
                                 f"expected {size} bytes with sha256 {digest[:12]}")
        return tmp
    except BaseException as exc:
        if isinstance(exc, Exception):
            _check_deadline(deadline, digest)  # whatever a cut-off read raised, say why it was cut off
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def file_sha256(path: str) -> str:
    """The hex SHA-256 of a file, read in chunks."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            sha.update(chunk)
    return sha.hexdigest()


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


def _stream_frames(src, head: bytes, sink: _HashingWriter) -> None:
    """Decode a stream of small independent frames on the shared decoder pool (``frames``)."""
    dec = frames.ParallelDecoder(sink.write)
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


def _stream_large(resp, sink: _HashingWriter, encoding: str, on_bytes: Callable[[int], None],
                  stored_sha=None) -> None:
    """Decode into a few reused buffers: fresh multi-MB allocations for every chunk
    cost a page fault per 4 KiB in a new process (a third of a 150 MB restore).
    A zstd blob of several small frames is decoded frame-parallel instead."""
    src = _Counted(resp, on_bytes, stored_sha)
    if encoding == "zstd":
        head = src.read(18)  # the longest zstd frame header: enough to read the first frame's size
        if frames.parallel_ok(head):
            _stream_frames(src, head, sink)
            resp.drain_conn()
            return
        src = _Prefixed(head, src)
    free: queue.Queue = queue.Queue()
    for _ in range(LARGE_BUFFERS):
        free.put(bytearray(LARGE_BUFFER))
    reader = (zstandard.ZstdDecompressor().stream_reader(src, read_size=CHUNK, closefd=False)
              if encoding == "zstd" else src)
    while True:
        buf = free.get()
        n = reader.readinto(buf)
        if not n:
            break
        sink.write(memoryview(buf)[:n], lambda buf=buf: free.put(buf))
    resp.drain_conn()  # past the zstd frame's end: nothing should be left, but never leave bytes unread
    # A truncated or oversized stream shows up as a size or sha256 mismatch in download().


def _check_deadline(deadline: Optional[float], digest: str) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise ServiceUnavailable(f"blob {digest[:12]}: the restore's time budget ran out mid-transfer") from None


def _fetch_into(sink: "_HashingWriter", url: str, headers: dict, encoding: str, digest: str, stall_timeout: float,
                on_bytes: Callable[[int], None], cutoff: Optional[Cutoff] = None, stored_sha=None) -> None:
    resp = None
    try:
        wait = stall_timeout
        if cutoff is not None and cutoff.deadline is not None:
            wait = max(0.05, min(stall_timeout, cutoff.deadline - time.monotonic()))
        resp = _pool(url).request("GET", url, headers=headers, preload_content=False, retries=False,
                               timeout=urllib3.Timeout(connect=min(10.0, wait), read=wait))
        if cutoff is not None and cutoff.deadline is not None:
            cutoff.add(resp)  # shut down at the deadline; download() reports why
        if resp.status >= 400:
            raise_for_response(_ErrorView("GET", url, resp.status, resp.reason, resp.read(65536)))
        if sink._lanes:
            _stream_large(resp, sink, encoding, on_bytes, stored_sha)
            dec = None
        else:
            dec = zstandard.ZstdDecompressor().decompressobj() if encoding == "zstd" else None
            for chunk in resp.stream(CHUNK):
                on_bytes(len(chunk))
                sink.write(dec.decompress(chunk) if dec is not None else chunk)
        if dec is not None and not dec.eof:
            raise IntegrityError(f"blob {digest[:12]}: zstd stream ended early")
        resp.release_conn()  # read to the end: the connection goes back to the pool
        resp = None
    except urllib3.exceptions.HTTPError as exc:
        raise ServiceUnavailable(f"blob {digest[:12]}: transfer failed: {exc}") from None
    except (zstandard.ZstdError, frames.FrameError) as exc:
        raise IntegrityError(f"blob {digest[:12]}: bad zstd data: {exc}") from None
    finally:
        if cutoff is not None and resp is not None:
            cutoff.discard(resp)
        if resp is not None:
            resp.close()  # an error mid-body: this connection must not be reused


def fetch_bytes(url: str, headers: dict, byte_range: Optional[Tuple[int, int]], stall_timeout: float,
                on_bytes: Callable[[int], None], cutoff: Optional[Cutoff] = None, what: str = "pack") -> Tuple[bytes, int]:
    """GET ``url`` (a pack), the bytes ``[start, end)`` of ``byte_range`` or all of it; return (data, the
    offset in the object where ``data`` starts). A server that ignores ``Range`` (200) is fine: the whole
    object comes back with offset 0. Raises ServiceUnavailable (transfer failed, stalled, cut off),
    IntegrityError (fewer bytes than asked for), another CacheClientError for an error answer."""
    if byte_range is not None:
        headers = {**headers, "Range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"}
    deadline = cutoff.deadline if cutoff is not None else None
    resp = None
    try:
        wait = stall_timeout
        if deadline is not None:
            wait = max(0.05, min(stall_timeout, deadline - time.monotonic()))
        resp = _pool(url).request("GET", url, headers=headers, preload_content=False, retries=False,
                                  timeout=urllib3.Timeout(connect=min(10.0, wait), read=wait))
        if deadline is not None:
            cutoff.add(resp)
        if resp.status >= 400:
            raise_for_response(_ErrorView("GET", url, resp.status, resp.reason, resp.read(65536)))
        chunks = []
        for chunk in resp.stream(CHUNK):
            on_bytes(len(chunk))
            chunks.append(chunk)
        resp.release_conn()
        resp_status, content_range, resp = resp.status, resp.headers.get("Content-Range"), None
    except urllib3.exceptions.HTTPError as exc:
        _check_deadline(deadline, what)
        raise ServiceUnavailable(f"{what}: transfer failed: {exc}") from None
    finally:
        if cutoff is not None and resp is not None:
            cutoff.discard(resp)
        if resp is not None:
            resp.close()
    data = b"".join(chunks)
    # Where the bytes start: Content-Range says (some S3 servers send it with a 200), else a 206 is the
    # range asked for, else the server ignored Range and sent it all.
    base = _range_start(content_range) if content_range else (
        byte_range[0] if byte_range is not None and resp_status == 206 else 0)
    if byte_range is not None and base + len(data) < byte_range[1]:
        raise IntegrityError(f"{what}: got {len(data)} bytes from offset {base}, wanted up to {byte_range[1]}")
    return data, base


def _range_start(content_range: str) -> int:
    """The first byte's offset from a ``Content-Range: bytes <first>-<last>/<size>`` header."""
    try:
        return int(content_range.split()[1].split("-")[0])
    except (IndexError, ValueError):
        raise IntegrityError(f"unreadable Content-Range {content_range!r}") from None


def write_member(data, encoding: str, digest: str, size: int, dest_dir: str) -> str:
    """Decode one pack member's stored bytes, check size and sha256, and write them to a new temp file in
    ``dest_dir``; return its path. Raises IntegrityError (nothing left behind), OSError."""
    try:
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=size) if encoding == "zstd" else data
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"blob {digest[:12]}: bad zstd data in its pack: {exc}") from None
    got = hashlib.sha256(raw).hexdigest()
    if len(raw) != size or got != digest:
        raise IntegrityError(f"blob {digest[:12]}: its pack slice decodes to {len(raw)} bytes hashing to "
                             f"{got[:12]}, expected {size} bytes with sha256 {digest[:12]}")
    fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=f".cachesvc-{os.getpid()}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(raw)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


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


