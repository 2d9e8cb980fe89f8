"""Bounded decoding: every stored byte the client decodes goes through here.

Stored bytes are untrusted: anyone who can write to the bucket (or the local
blob folder) can replace an object after commit, for instance with 128 KiB
of zstd that decodes to several GiB. So every decode stops at the size the
manifest declares: one decoded byte more is ``Oversize`` (an IntegrityError:
that file is a miss), never a MemoryError and never GiBs written to disk.
Memory stays bounded by the piece size the caller reads into and zstd's
window, which is capped (``MAX_WINDOW``; a frame asking for more is
refused). The stored bytes are bounded too (``stored_limit``), so a stream
that decodes to nothing cannot feed a restore for ever.

    decode_into(src, encoding, size, what=, emit=, buffers=)  a stream: pull, decode, emit pieces (downloads)
    decode_bytes(data, encoding, size, what=)                one pack member, already in memory
    Limited(raw, limit, ...)                         a readable that refuses past ``limit`` stored bytes

Frames decoded in parallel (``frames.ParallelDecoder``) use the same rule:
their declared sizes may not add up past the blob's size.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import zstandard

from ..errors import IntegrityError
from ..shared.rules import MAX_WINDOW, stored_limit  # noqa: F401 (the bounds the service's decoder uses too)


class Oversize(IntegrityError):
    """Stored bytes that decode (or arrive) past their declared size."""


def decompressor(max_window: int = MAX_WINDOW) -> zstandard.ZstdDecompressor:
    """A fresh zstd decompressor that refuses windows over ``max_window`` (not thread-safe: one per stream)."""
    return zstandard.ZstdDecompressor(max_window_size=max_window)


class Decoders:
    """What the decodes of one restore share: a zstd context per thread and window (one-shot decodes of
    pack members: thousands per restore, each a fresh context otherwise) and, on first need, the small
    thread pool that decodes independent frames in parallel (``frames.ParallelDecoder``).

    Thread-safe. Use as a context manager, or ``close()``: that waits for the pool's threads.
    """

    def __init__(self, threads: int = 2):
        self.threads = threads
        self._local = threading.local()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._lock = threading.Lock()

    def context(self, max_window: int = MAX_WINDOW) -> zstandard.ZstdDecompressor:
        """The calling thread's decompressor for ``max_window`` (reused: one decode at a time per thread)."""
        contexts = self._local.__dict__.setdefault("contexts", {})
        dctx = contexts.get(max_window)
        if dctx is None:
            dctx = contexts[max_window] = decompressor(max_window)
        return dctx

    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="cachesvc-zstd")
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> "Decoders":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Limited:
    """A readable over ``raw`` that hands out at most ``limit`` bytes: Oversize once ``raw`` has more.

    ``on_bytes(n)`` is told of every read (progress); ``sha``, if given, hashes what passes.
    """

    def __init__(self, raw, limit: int, what: str, *, on_bytes: Callable[[int], None] = lambda n: None, sha=None):
        self.raw, self.left, self.what, self.on_bytes, self.sha = raw, limit, what, on_bytes, sha

    def _passed(self, n: int, data) -> None:
        self.left -= n
        if self.left < 0:
            raise Oversize(f"{self.what}: more stored bytes than its size allows; refused")
        self.on_bytes(n)
        if self.sha is not None:
            self.sha.update(data)

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(self.left + 1 if n < 0 or n > self.left + 1 else n)
        self._passed(len(data), data)
        return data

    def readinto(self, buf) -> int:
        view = memoryview(buf)
        view = view[:self.left + 1] if len(view) > self.left + 1 else view
        n = self.raw.readinto(view)
        self._passed(n, view[:n])
        return n


def decode_into(src, encoding: str, size: int, *, what: str, emit: Callable[[memoryview, Callable[[], None]], None],
                buffers: "queue.Queue[bytearray]") -> None:
    """Read stored bytes from ``src``, decode them and ``emit(view, release)`` the decoded bytes in pieces
    of at most one buffer from ``buffers`` (``release()`` hands the buffer back; ``emit`` may pass both to
    another thread). A zstd stream may hold several frames.

    Raises Oversize when the bytes decode past ``size``, IntegrityError when they decode to less or are
    not valid zstd.
    """
    reader = (decompressor().stream_reader(src, read_size=1 << 20, read_across_frames=True, closefd=False)
              if encoding == "zstd" else src)
    got = 0
    try:
        while True:
            buf = buffers.get()
            view = memoryview(buf)[:min(len(buf), size + 1 - got)]  # room for one byte too many, no more
            n = reader.readinto(view)
            if not n:
                buffers.put(buf)
                break
            got += n
            if got > size:
                buffers.put(buf)
                raise Oversize(f"{what}: decodes past its {size} bytes; refused")
            emit(view[:n], lambda buf=buf: buffers.put(buf))
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"{what}: bad zstd data: {exc}") from None
    if got != size:
        raise IntegrityError(f"{what}: decodes to {got} bytes, expected {size}")


def decode_bytes(data, encoding: str, size: int, *, what: str, decoders: Optional[Decoders] = None) -> bytes:
    """One pack member's stored bytes, decoded: exactly ``size`` bytes, or IntegrityError (Oversize when
    it would decode to more). Allocates at most ``size`` bytes. ``decoders``: the restore's contexts
    (None: a fresh one)."""
    if encoding == "identity":
        if len(data) != size:
            raise IntegrityError(f"{what}: {len(data)} stored bytes, expected {size}")
        return bytes(data)
    try:
        declared = zstandard.frame_content_size(data)
        if declared not in (-1, size):
            raise (Oversize if declared > size else IntegrityError)(
                f"{what}: its zstd frame declares {declared} bytes, expected {size}; refused")
        dctx = decoders.context() if decoders is not None else decompressor()
        # A declared size is what decompress() allocates (checked above); an undeclared one gets size + 1.
        raw = dctx.decompress(data, max_output_size=size + 1)
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"{what}: bad zstd data: {exc}") from None
    if len(raw) != size:
        raise IntegrityError(f"{what}: decodes to {len(raw)} bytes, expected {size}")
    return raw


def single_buffer(size: int, cap: int = 1 << 20) -> "queue.Queue[bytearray]":
    """One reused decode buffer for a small blob decoded inline: ``size`` + 1 bytes, at most ``cap``."""
    q: "queue.Queue[bytearray]" = queue.Queue()
    q.put(bytearray(min(cap, size + 1)))
    return q


def buffers(count: int, size: int) -> "queue.Queue[bytearray]":
    q: "queue.Queue[bytearray]" = queue.Queue()
    for _ in range(count):
        q.put(bytearray(size))
    return q

