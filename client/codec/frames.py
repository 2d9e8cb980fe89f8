"""Large blobs as independent zstd frames: written at publish, decoded on several threads at restore.

One zstd frame decodes on one thread (its blocks refer back to each other),
so a 150 MB precompiled header is one thread's work at restore. Publish
therefore compresses blobs of at least FRAMED_MIN decoded bytes as a run of
independent frames of FRAME_SIZE decoded bytes each, every frame carrying
its decoded size and a content checksum (xxh64). The concatenation is still
one valid zstd stream (RFC 8878 section 3.1): every zstd decoder, older
clients' included, reads it whole.

Restore finds frame boundaries by walking frame and block headers (no
decoding), hands whole frames to a small shared thread pool
(python-zstandard releases the GIL) and emits their output in order.

Only the frame *layout* is trusted from the stream for scheduling; what the
frames decode to is checked by the caller (sha256), and each frame's
checksum is checked by the decoder. Sizes are bounded before any decoding
(``cachesvc_client.codec.decoding``): a frame declares at most FRAME_MAX bytes and
decodes to exactly what it declares, and the frames' declared sizes may not
add up past the blob's size.
"""
from __future__ import annotations

import queue
from concurrent.futures import Future
from typing import Callable, Iterable, Iterator, List, Optional, Tuple

import zstandard

from .decoding import Decoders, Oversize

#: blobs at least this large (decoded) are published as several frames
FRAMED_MIN = 32 << 20
#: decoded bytes per frame
FRAME_SIZE = 2 << 20
#: a stream whose frames declare more than this many decoded bytes is not decoded in parallel
FRAME_MAX = 32 << 20
#: decoder threads of one restore (``decoding.Decoders``), shared by its downloads
DECODE_THREADS = 2
#: frames submitted ahead of the one being emitted
AHEAD = 2
#: decode buffers per stream (reused: a fresh multi-MB allocation per frame costs a page fault per 4 KiB);
#: those not in flight are with the consumer until it releases them
BUFFERS = 4

_MAGIC = 0xFD2FB528
#: the longest a frame of FRAME_MAX decoded bytes can be (zstd's bound: raw blocks plus headers), with room
_LONGEST = FRAME_MAX + FRAME_MAX // 64 + (1 << 16)
_SKIPPABLE_LO, _SKIPPABLE_HI = 0x184D2A50, 0x184D2A5F


class FrameError(ValueError):
    """The bytes are not a well-formed run of zstd frames."""


def compress_framed(chunks: Iterable[bytes], level: int) -> Iterator[bytes]:
    """Compress each chunk (FRAME_SIZE bytes, the last may be shorter) as one independent frame
    with its content size and checksum. Yields the frames."""
    cctx = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    for chunk in chunks:
        yield cctx.compress(chunk)


def frame_length(buf, pos: int = 0) -> Optional[int]:
    """Bytes of the frame (zstd or skippable) that starts at ``buf[pos]``; None when ``buf`` ends first.

    Walks the frame header and the 3-byte block headers; decodes nothing.
    Raises FrameError when ``buf[pos:]`` does not start with a frame.
    """
    end = len(buf)
    if end - pos < 4:
        return None
    magic = int.from_bytes(buf[pos:pos + 4], "little")
    if _SKIPPABLE_LO <= magic <= _SKIPPABLE_HI:
        if end - pos < 8:
            return None
        n = 8 + int.from_bytes(buf[pos + 4:pos + 8], "little")
        return n if end - pos >= n else None
    if magic != _MAGIC:
        raise FrameError(f"no zstd frame at byte {pos} (magic {magic:#010x})")
    if end - pos < 5:
        return None
    fhd = buf[pos + 4]
    fcs_flag, single_segment, has_checksum, dict_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
    if fhd & 0x08:
        raise FrameError(f"zstd frame at byte {pos} sets the reserved header bit")
    p = pos + 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag] \
        + ((1 if single_segment else 0), 2, 4, 8)[fcs_flag]
    while True:
        if end - p < 3:
            return None
        header = int.from_bytes(buf[p:p + 3], "little")
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        if kind == 3:
            raise FrameError(f"reserved block type in the zstd frame at byte {pos}")
        p += 3 + (1 if kind == 1 else size)  # an RLE block stores one byte
        if last:
            break
    p += 4 if has_checksum else 0
    return p - pos if p <= end else None


def content_size(frame_start) -> Optional[int]:
    """The decoded size a zstd frame header declares (None: not declared, or not a zstd frame)."""
    try:
        size = zstandard.frame_content_size(bytes(frame_start[:18]))
    except zstandard.ZstdError:
        return None
    return size if size >= 0 else None


def parallel_ok(first_bytes) -> bool:
    """True when a stream starting with ``first_bytes`` (at least 18 bytes, or all of it) is worth
    decoding frame by frame: its first frame declares at most FRAME_MAX decoded bytes. A blob from a
    publisher that wrote one frame (size undeclared or large) is decoded as one stream instead."""
    size = content_size(first_bytes)
    return size is not None and size <= FRAME_MAX


def _decode_into(decoders: Decoders, frame: bytes, *, buf: bytearray, size: int) -> memoryview:
    """Decode one whole frame into ``buf``; the view of its ``size`` decoded bytes. Raises FrameError."""
    out = memoryview(buf)[:size]
    got = 0
    try:
        reader = decoders.context(FRAME_MAX).stream_reader(frame)
        while got < size:
            n = reader.readinto(out[got:])
            if not n:
                break
            got += n
        extra = reader.read(1)  # steps over the frame's end, where zstd checks the content checksum
    except zstandard.ZstdError as exc:
        raise FrameError(f"bad zstd frame: {exc}") from None
    if got != size or extra:
        raise FrameError(f"a zstd frame decoded to {got + len(extra)}+ bytes, its header says {size}")
    return out


class ParallelDecoder:
    """Feed compressed bytes in order; decoded frames come out in order through ``emit``.

    ``feed(data)`` buffers ``data``, submits every frame it completes to the
    shared decoder pool and emits decoded frames, keeping at most AHEAD in
    flight. ``emit(view, release)`` gets a view of one frame's decoded bytes
    in a reused buffer and must call ``release()`` once done with it (it may
    hand both to another thread). ``finish()`` emits the rest and raises
    FrameError when the stream stopped mid-frame. Any FrameError from a bad
    frame or checksum is raised by ``feed`` or ``finish``; Oversize (before
    decoding) when the frames declare more than ``limit`` bytes in all (None:
    no limit). ``decoders``: the restore's decoder pool (None: one of its own, closed by ``close``).
    Not thread-safe: one feeding thread.
    """

    def __init__(self, emit: Callable[[memoryview, Callable[[], None]], None], limit: Optional[int] = None,
                 what: str = "a framed blob", *, decoders: Optional[Decoders] = None):
        self.emit, self.limit, self.what = emit, limit, what
        self._own = decoders is None
        self.decoders = decoders or Decoders(DECODE_THREADS)
        self.declared = 0
        self._buf = bytearray()
        self._pos = 0
        self._pending: List[Tuple[Future, bytearray]] = []
        self._free: queue.Queue = queue.Queue()
        for _ in range(BUFFERS):
            self._free.put(None)  # allocated on first use, at the size the frames need
        self.frames = 0

    def _submit(self, frame: bytes) -> None:
        size = content_size(frame)
        if size is None or size > FRAME_MAX:
            raise FrameError(f"a zstd frame declares {size} decoded bytes; at most {FRAME_MAX} are expected here")
        self.declared += size
        if self.limit is not None and self.declared > self.limit:
            raise Oversize(f"{self.what}: its zstd frames decode past its {self.limit} bytes; refused")
        buf = self._free.get()  # waits while the consumer holds them all
        if buf is None or len(buf) < size:
            buf = bytearray(max(size, FRAME_SIZE))
        self._pending.append((self.decoders.pool().submit(_decode_into, self.decoders, frame, buf=buf, size=size), buf))

    def feed(self, data) -> None:
        self._buf += data
        while True:
            n = frame_length(self._buf, self._pos)
            if n is None:
                if len(self._buf) - self._pos > _LONGEST:
                    raise FrameError(f"a zstd frame runs past {_LONGEST} bytes; at most {FRAME_MAX} decoded "
                                     "bytes per frame are expected here")
                break
            start, self._pos = self._pos, self._pos + n
            if int.from_bytes(self._buf[start:start + 4], "little") == _MAGIC:
                with memoryview(self._buf) as view:
                    frame = bytes(view[start:self._pos])
                self._submit(frame)
                self.frames += 1
                self._drain(AHEAD)
        if self._pos:  # keep only the partial frame: a small buffer, reused, not MBs of fresh pages
            del self._buf[:self._pos]
            self._pos = 0

    def _drain(self, keep: int) -> None:
        while len(self._pending) > keep:
            future, buf = self._pending.pop(0)
            try:
                view = future.result()
            except BaseException:
                self._free.put(buf)
                raise
            self.emit(view, lambda buf=buf: self._free.put(buf))

    def finish(self) -> None:
        try:
            self._drain(0)
        finally:
            self.close()
        if len(self._buf) > self._pos:
            raise FrameError(f"the zstd stream ends inside a frame ({len(self._buf) - self._pos} bytes left over)")

    def close(self) -> None:
        """Drop what is still queued (after an error); waits for running decodes to finish."""
        for f, _buf in self._pending:
            f.cancel()
        for f, _buf in self._pending:
            if not f.cancelled():
                f.exception()
        self._pending = []
        if self._own:
            self.decoders.close()
