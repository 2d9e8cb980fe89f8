"""Fetching one blob, or one pack member, into a verified temp file beside its target.

Downloads stream into a temp file in the target's own folder, hashing the
decoded bytes as they arrive; only a file whose sha256 matches is handed
back to be renamed into place, so nobody ever sees half a file. The temp
file is removed on every failure, before the failure is reported.

Everything received is untrusted: stored bytes are read up to what their
size allows and decoded with the bound of ``decoding`` (a bomb is refused
at its declared size plus one byte); the GET itself, its bounds and its
deadline are ``transport.blobs``'.

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
from typing import BinaryIO, Callable, Optional

from ..codec import decoding, frames
from ..codec.encoding import CHUNK, file_sha256
from ..errors import IntegrityError
from ..transport import blobs
from ..transport.deadlines import Deadline
from ..transport.session import Transport

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


def _cleanup(tmp: str, exc: BaseException, *, deadline: Optional[Deadline], what: str) -> None:
    """After a failed download: the temp file goes first; then, for a transfer cut off at the deadline,
    say so (whatever the cut-off read raised)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    if isinstance(exc, Exception) and deadline is not None:
        deadline.check(what)


def download(transport: Transport, url: str, headers: dict, *, encoding: str, digest: str, size: int,
             dest_dir: str, stall_timeout: float, on_bytes: Callable[[int], None],
             deadline: Optional[Deadline] = None, stored_sha256: Optional[str] = None,
             decoders: Optional[decoding.Decoders] = None) -> str:
    """Fetch a blob into a new temp file in ``dest_dir`` and return its path.

    ``stored_sha256``: the sha256 of the stored (encoded) bytes, as the
    service recorded it after checking that they decode to ``digest``; for a
    large zstd blob the stored bytes are hashed instead of the decoded ones,
    and the decoded file is hashed only when that does not match.
    ``decoders``: the restore's decoder pool, for blobs published as frames.

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
                blobs.get(transport, url, headers, stall_timeout=stall_timeout, deadline=deadline, what=what,
                          consume=lambda resp: _decode(resp, sink, encoding, size=size, what=what,
                                                       on_bytes=on_bytes, stored_sha=stored_sha,
                                                       decoders=decoders))
            finally:
                sink.close()
        if stored_sha is not None and stored_sha.hexdigest() == stored_sha256:
            return tmp  # the very bytes the service verified, decoded to the expected length
        got = sink.sha.hexdigest() if sink.sha is not None else file_sha256(tmp)
        if got != digest:
            raise IntegrityError(f"{what}: its {size} bytes hash to {got[:12]}, expected {digest[:12]}")
        return tmp
    except BaseException as exc:
        _cleanup(tmp, exc, deadline=deadline, what=what)
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


def _decode(resp, sink: _HashingWriter, encoding: str, *, size: int, what: str, on_bytes: Callable[[int], None],
            stored_sha=None, decoders: Optional[decoding.Decoders] = None) -> None:
    """Stream the stored bytes of ``resp`` through the bounded decoder into ``sink``.

    Large blobs decode into a few reused buffers (fresh multi-MB allocations for every chunk cost a
    page fault per 4 KiB in a new process: a third of a 150 MB restore), or frame-parallel when they
    were published as several small frames; small ones into one buffer, inline."""
    src = decoding.Limited(resp, decoding.stored_limit(encoding, size), what, on_bytes=on_bytes, sha=stored_sha)
    try:
        if not sink.threaded:
            decoding.decode_into(src, encoding, size, what=what, emit=sink.write, buffers=decoding.single_buffer(size))
            return
        if encoding == "zstd":
            head = src.read(18)  # the longest zstd frame header: enough to read the first frame's size
            if frames.parallel_ok(head):
                _decode_frames(src, head, sink, size=size, what=what, decoders=decoders)
                return
            src = _Prefixed(head, src)
        decoding.decode_into(src, encoding, size, what=what, emit=sink.write,
                             buffers=decoding.buffers(LARGE_BUFFERS, LARGE_BUFFER))
    except frames.FrameError as exc:
        raise IntegrityError(f"{what}: bad zstd data: {exc}") from None


def _decode_frames(src, head: bytes, sink: _HashingWriter, *, size: int, what: str,
                   decoders: Optional[decoding.Decoders]) -> None:
    """Decode a stream of small independent frames on the shared decoder pool (``frames``)."""
    dec = frames.ParallelDecoder(sink.write, limit=size, what=what, decoders=decoders)
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

def write_member(data, *, encoding: str, digest: str, size: int, dest_dir: str,
                 decoders: Optional[decoding.Decoders] = None) -> str:
    """Decode one pack member's stored bytes (bounded by ``size``), check its sha256, and write it to a new
    temp file in ``dest_dir``; return its path. Raises IntegrityError (nothing left behind), OSError."""
    what = f"blob {digest[:12]} (in its pack)"
    raw = decoding.decode_bytes(data, encoding, size, what=what, decoders=decoders)
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
