"""The service's one decoder of stored bytes: bounded by the declared size, in memory and in work.

Every byte the service decodes (a blob PUT through it, a pack member checked
at commit, a large object read back from S3 at commit, a live remote-cache
value) comes from someone it does not trust: a publisher, or whoever can
write to the bucket. A few hundred KiB of zstd can decode to many GiB, and
``zstandard``'s streaming objects return all the output of the input they are
given at once. So ``BoundedDecoder`` walks the frame and block headers itself
(RFC 8878: frame header, 3-byte block headers, the optional checksum) and
hands zstd one block at a time: a block decodes to at most 128 KiB, so every
step's output is bounded, and the count of decoded bytes is checked after
each step. One byte past ``limit`` is a refusal (``BadBlob``); so is a frame
whose window exceeds ``MAX_WINDOW`` (zstd would allocate it), a stream that
ends inside a frame, and a skippable frame (no publisher writes one).

Memory per decoder: one block of input, one block of output and the frame's
window (at most ``MAX_WINDOW``; the client and the remote cache compress at
level 3, whose window is 2 MiB).
"""
from __future__ import annotations

from typing import Iterator, List, Optional

import zstandard

#: the largest block zstd writes or reads (RFC 8878 "Block_Maximum_Size")
BLOCK_MAX = 128 << 10
#: frames that need a larger window are refused (level 3, what cachesvc compresses with, uses 2 MiB)
MAX_WINDOW = 8 << 20
_MAGIC = 0xFD2FB528


def stored_bound(size: int) -> int:
    """The most stored bytes an encoding of ``size`` decoded bytes may take (zstd's worst case, incompressible
    data in raw blocks, plus frame headers every 2 MiB, with room to spare)."""
    return size + size // 64 + (64 << 10)


class BadBlob(ValueError):
    """The bytes are not a valid encoding of the blob (the message says why; ``details`` for the answer)."""

    def __init__(self, message: str, details: Optional[dict] = None):
        super().__init__(message)
        self.details = details


class BoundedDecoder:
    """Decode bytes stored as ``encoding`` (``identity``, or ``zstd``: one or more concatenated frames),
    fed in chunks of any size, refusing them once they decode past ``limit`` bytes.

    ``feed(chunk)`` yields the decoded bytes of ``chunk`` in pieces of at most ``BLOCK_MAX`` bytes (exhaust
    it before feeding again); ``finish()`` checks that the input ended at the end of a frame and returns
    the decoded size. Both raise BadBlob. Not thread-safe: one decoder per stream.
    """

    def __init__(self, encoding: str, limit: int):
        if encoding not in ("identity", "zstd"):
            raise BadBlob(f"unknown encoding {encoding!r}")
        self.encoding, self.limit = encoding, limit
        self.size = 0        # decoded bytes so far
        self.stored = 0      # input bytes fed so far
        self.consumed = 0    # input bytes handed to zstd so far
        self.frames = 0
        self._buf = bytearray()  # input the current step still waits for: at most one block
        self._need, self._step = 4, self._magic
        self._dctx = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
        self._dec = None
        self._last = self._checksum = False

    def _count(self, n: int) -> None:
        self.size += n
        if self.size > self.limit:
            raise BadBlob(f"the stored bytes decode to more than the declared {self.limit} bytes; refused at "
                          f"{self.size}", {"declared_size": self.limit})

    def feed(self, chunk) -> Iterator[bytes]:
        self.stored += len(chunk)
        if self.stored > stored_bound(self.limit):  # e.g. endless empty frames, which decode to nothing
            raise BadBlob(f"the stored bytes run past {stored_bound(self.limit)}, longer than any encoding of "
                          f"the declared {self.limit} bytes", {"declared_size": self.limit})
        if self.encoding == "identity":
            self._count(len(chunk))
            if chunk:
                yield bytes(chunk)
            return
        self._buf += chunk
        pos = 0
        try:
            with memoryview(self._buf) as view:
                while len(view) - pos >= self._need:
                    with view[pos:pos + self._need] as piece:  # released before the buffer shrinks
                        pos += self._need
                        out = self._run(piece)
                    if out:
                        self._count(len(out))
                        yield out
        finally:
            del self._buf[:pos]

    def _run(self, piece) -> bytes:
        self.consumed += len(piece)
        step = self._step
        try:
            return step(piece)
        except zstandard.ZstdError as exc:
            raise BadBlob(f"not a valid zstd stream (frame {self.frames + 1}): {exc}") from None

    def _magic(self, piece) -> bytes:
        magic = int.from_bytes(piece, "little")
        if magic != _MAGIC:
            raise BadBlob(f"no zstd frame at stored byte {self.consumed - 4} (magic {magic:#010x}); skippable "
                          "and foreign frames are refused")
        self._dec = self._dctx.decompressobj()
        self._dec.decompress(piece)
        self._need, self._step = 1, self._descriptor
        return b""

    def _descriptor(self, piece) -> bytes:
        fhd = piece[0]
        if fhd & 0x08:
            raise BadBlob(f"zstd frame {self.frames + 1} sets the reserved header bit")
        single_segment, dict_flag, fcs_flag = (fhd >> 5) & 1, fhd & 3, fhd >> 6
        self._checksum = bool(fhd & 0x04)
        self._dec.decompress(piece)
        window = 0 if single_segment else 1
        rest = window + (0, 1, 2, 4)[dict_flag] + ((1 if single_segment else 0), 2, 4, 8)[fcs_flag]
        self._need, self._step = (rest, self._header_rest) if rest else (3, self._block_header)
        return b""

    def _header_rest(self, piece) -> bytes:
        self._dec.decompress(piece)  # zstd checks the window against MAX_WINDOW here
        self._need, self._step = 3, self._block_header
        return b""

    def _block_header(self, piece) -> bytes:
        header = int.from_bytes(piece, "little")
        self._last, kind, size = bool(header & 1), (header >> 1) & 3, header >> 3
        if kind == 3 or size > BLOCK_MAX:
            raise BadBlob(f"zstd frame {self.frames + 1} has a reserved or oversized block")
        out = self._dec.decompress(piece)
        self._need, self._step = (1 if kind == 1 else size), self._block_body  # an RLE block stores one byte
        if self._need == 0:  # an empty raw block: nothing to wait for
            return out + self._block_body(b"")
        return out

    def _block_body(self, piece) -> bytes:
        out = self._dec.decompress(piece) if piece else b""
        if not self._last:
            self._need, self._step = 3, self._block_header
        elif self._checksum:
            self._need, self._step = 4, self._frame_end
        else:
            out += self._frame_end(b"")
        return out

    def _frame_end(self, piece) -> bytes:
        out = self._dec.decompress(piece) if piece else b""  # the content checksum, checked by zstd
        if not self._dec.eof or self._dec.unused_data:
            raise BadBlob(f"zstd frame {self.frames + 1} does not end where its blocks say")
        self.frames += 1
        self._dec = None
        self._need, self._step = 4, self._magic
        return out

    def finish(self) -> int:
        """The decoded size; raises BadBlob unless the input ended exactly at the end of a frame."""
        if self.encoding == "zstd" and (self._step != self._magic or self._buf or not self.frames):
            raise BadBlob("the zstd stream is truncated: it ends inside a frame" if self.frames or self._buf
                          or self._dec is not None else "the zstd stream is empty")
        return self.size


def decode_all(raw, encoding: str, limit: int) -> bytes:
    """The decoded bytes of ``raw`` (at most ``limit`` of them). Raises BadBlob."""
    dec = BoundedDecoder(encoding, limit)
    out: List[bytes] = list(dec.feed(raw))
    dec.finish()
    return b"".join(out)
