"""The service's one decoder of stored bytes: bounded by the declared size, in memory and in work.

Every byte the service decodes (a blob PUT through it, a pack member checked
at commit, a large object read back from S3 at commit, a live remote-cache
value) comes from someone it does not trust: a publisher, or whoever can
write to the bucket. A few hundred KiB of zstd can decode to many GiB. So
decoding pulls: ``zstandard``'s ``stream_reader`` hands out at most the bytes
asked for, and ``pieces`` never asks for more than one byte past the
declared size, so one byte too many is a refusal (``BadBlob``) after at most
``CHUNK`` bytes of output; the stored bytes are bounded too
(``rules.stored_limit``, the client's bound too: endless empty frames decode to nothing), and so is zstd's
window (``MAX_WINDOW``: a frame asking for more is refused before zstd
allocates it).

What decodes to the declared size is then checked by its sha256 (the
callers do), so a stream cut inside a frame's checksum, or a skippable frame,
costs nothing: the content is what it must be, or it is refused.

Memory per decode: one chunk of input, one chunk of output and the window
(the client and the remote cache compress at level 3, whose window is 2 MiB).
"""
from __future__ import annotations

import io
from typing import BinaryIO, Iterator, Optional

import zstandard
from cachesvc_client.shared.rules import ENCODINGS, MAX_WINDOW, stored_limit  # the client's decoder's bounds too

#: the most decoded bytes one step hands out (and the input read at a time)
CHUNK = 1 << 20


class BadBlob(ValueError):
    """The bytes are not a valid encoding of the blob (the message says why; ``details`` for the answer)."""

    def __init__(self, message: str, details: Optional[dict] = None):
        super().__init__(message)
        self.details = details


class _Bounded:
    """A readable over ``raw`` that refuses more than ``stored_limit(encoding, limit)`` stored bytes and
    tells ``seen(chunk)`` of each chunk read (the stored bytes' hash, a temp file)."""

    def __init__(self, raw: BinaryIO, encoding: str, limit: int, seen):
        self.bound = stored_limit(encoding, limit)
        # identity: the stored bytes are the decoded ones, so Decode's own check (one byte past the
        # declared size) is this same bound, and it says so in the declared size's words
        self.raw, self.left, self.limit, self.seen = raw, self.bound + (encoding == "identity"), limit, seen
        self.stored = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(self.left + 1 if n < 0 or n > self.left + 1 else n)
        self.left -= len(data)
        self.stored += len(data)
        if self.left < 0:
            raise BadBlob(f"the stored bytes run past {self.bound}, longer than any encoding of "
                          f"the declared {self.limit} bytes", {"declared_size": self.limit})
        if data:
            self.seen(data)
        return data


class Decode:
    """The decoded bytes of readable ``raw`` stored as ``encoding`` (``identity``, or ``zstd``: one or more
    concatenated frames), refused once they pass ``limit``. Iterate it for pieces of at most ``CHUNK``
    bytes; afterwards ``size`` and ``stored`` are the decoded and stored byte counts. ``seen(chunk)`` is
    told of every stored chunk read. Raises BadBlob. One stream per object, one thread."""

    def __init__(self, raw: BinaryIO, encoding: str, limit: int, seen=lambda chunk: None):
        if encoding not in ENCODINGS:
            raise BadBlob(f"unknown encoding {encoding!r}")
        self.encoding, self.limit = encoding, limit
        self._src = _Bounded(raw, encoding, limit, seen)
        self.size = 0

    @property
    def stored(self) -> int:
        return self._src.stored

    def __iter__(self) -> Iterator[bytes]:
        reader = self._src
        if self.encoding == "zstd":
            reader = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).stream_reader(
                self._src, read_size=CHUNK, read_across_frames=True, closefd=False)
        try:
            while True:
                piece = reader.read(min(CHUNK, self.limit + 1 - self.size))
                if not piece:
                    break
                self.size += len(piece)
                if self.size > self.limit:
                    raise BadBlob(f"the stored bytes decode to more than the declared {self.limit} bytes; "
                                  f"refused at {self.size}", {"declared_size": self.limit})
                yield piece
        except zstandard.ZstdError as exc:
            raise BadBlob(f"not a valid zstd stream: {exc}") from None
        if self.encoding == "zstd" and self.stored == 0:
            raise BadBlob("the zstd stream is empty")


def decode_all(raw, encoding: str, limit: int) -> bytes:
    """The decoded bytes of ``raw`` (bytes-like; at most ``limit`` of them). Raises BadBlob."""
    return b"".join(Decode(io.BytesIO(raw), encoding, limit))
