"""Large blobs as several zstd frames: the layout publish writes, and decoding it frame-parallel."""
from __future__ import annotations

import hashlib
import io
import os

import pytest
import zstandard

from cachesvc.storage.decoding import BadBlob, decode_all
from cachesvc_client.codec import frames
from cachesvc_client.codec.encoding import encode
from tests.helpers.client import blob_bytes


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """(decoded bytes, stored bytes as publish encodes them) for a blob of 3.5 frames past FRAMED_MIN."""
    data = blob_bytes(frames.FRAMED_MIN + frames.FRAME_SIZE * 3 + 12345)
    path = tmp_path_factory.mktemp("frames") / "big.h.gch"
    path.write_bytes(data)
    encoding, body, length = encode(str(path), hashlib.sha256(data).hexdigest())
    stored = body.read()
    body.close()
    assert encoding == "zstd" and len(stored) == length
    return data, stored


def split(stored: bytes) -> list:
    out, pos = [], 0
    while pos < len(stored):
        n = frames.frame_length(stored, pos)
        assert n is not None
        out.append(stored[pos:pos + n])
        pos += n
    return out


def parallel_decode(stored: bytes, step: int) -> bytes:
    out = []

    def emit(view, release):
        out.append(bytes(view))
        release()

    dec = frames.ParallelDecoder(emit)
    try:
        for i in range(0, len(stored), step):
            dec.feed(stored[i:i + step])
        dec.finish()
    finally:
        dec.close()
    return b"".join(out)


def test_publish_writes_large_blobs_as_independent_checksummed_frames(large):
    data, stored = large
    parts = split(stored)
    assert len(parts) == -(-len(data) // frames.FRAME_SIZE)  # 8 MiB each, the last shorter
    for i, part in enumerate(parts):
        params = zstandard.get_frame_parameters(part)
        assert params.has_checksum
        assert params.content_size == min(frames.FRAME_SIZE, len(data) - i * frames.FRAME_SIZE)
        assert zstandard.ZstdDecompressor().decompress(part) == data[i * frames.FRAME_SIZE:][:frames.FRAME_SIZE]


def test_small_blobs_stay_one_frame(tmp_path):
    data = blob_bytes(frames.FRAMED_MIN - 1)
    (tmp_path / "f").write_bytes(data)
    _, body, _ = encode(str(tmp_path / "f"), hashlib.sha256(data).hexdigest())
    with body:
        stored = body.read()
    assert len(split(stored)) == 1 and not frames.parallel_ok(stored[:18])


@pytest.mark.parametrize("step", [1 << 20, 65536 + 7, 3_000_001])
def test_frames_decode_in_parallel_whatever_the_chunking(large, step):
    data, stored = large
    assert frames.parallel_ok(stored[:18])
    assert parallel_decode(stored, step) == data


def test_every_decoder_reads_the_framed_stream_as_one(large):
    """Older clients (stream_reader, read_across_frames off), the service (cachesvc.content.blobs) and zstd's one-shot."""
    data, stored = large
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(stored), read_size=1 << 20, closefd=False)
    buf, got = bytearray(4 << 20), hashlib.sha256()
    while True:  # the loop the 0.1 client runs for a large blob
        n = reader.readinto(buf)
        if not n:
            break
        got.update(memoryview(buf)[:n])
    assert got.digest() == hashlib.sha256(data).digest()
    assert decode_all(stored, "zstd", len(data)) == data


def test_a_single_frame_blob_from_an_older_publisher_is_not_decoded_frame_parallel(large):
    data, _ = large
    cctx = zstandard.ZstdCompressor(level=3)
    streamed = io.BytesIO()
    with cctx.stream_writer(streamed, closefd=False) as zw:  # what publish wrote before: size not in the header
        zw.write(data)
    assert not frames.parallel_ok(streamed.getvalue()[:18])
    one_shot = cctx.compress(data)  # declares its size: too large a frame to buffer
    assert not frames.parallel_ok(one_shot[:18])


def test_a_corrupted_frame_is_an_error_not_bad_bytes(large):
    data, stored = large
    parts = split(stored)
    bad = bytearray(parts[2])
    bad[len(bad) // 2] ^= 0x40
    damaged = b"".join(parts[:2]) + bytes(bad) + b"".join(parts[3:])
    with pytest.raises(frames.FrameError):
        parallel_decode(damaged, 1 << 20)
    with pytest.raises(BadBlob):
        decode_all(damaged, "zstd", len(data))


def test_a_flipped_checksum_is_caught(large):
    _, stored = large
    parts = split(stored)
    bad = bytearray(parts[1])
    bad[-1] ^= 0x01  # the content checksum: the payload decodes, the checksum disagrees
    with pytest.raises(frames.FrameError):
        parallel_decode(parts[0] + bytes(bad), 1 << 20)


def test_a_truncated_stream_is_an_error(large):
    data, stored = large
    parts = split(stored)
    cut = b"".join(parts[:3]) + parts[3][:1000]
    with pytest.raises(frames.FrameError, match="ends inside a frame"):
        parallel_decode(cut, 1 << 20)
    assert len(decode_all(cut, "zstd", len(data))) < len(data)  # short: the service's size check refuses it


def test_bytes_after_the_last_frame_are_an_error(large):
    data, stored = large
    with pytest.raises(frames.FrameError, match="no zstd frame"):
        parallel_decode(stored + b"not a frame at all", 1 << 20)
    with pytest.raises(BadBlob):
        decode_all(stored + b"not a frame at all", "zstd", len(data))


def test_skippable_frames_are_stepped_over(large):
    data, stored = large
    parts = split(stored)
    skip = (0x184D2A50).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"hello"
    mixed = skip + parts[0] + skip + b"".join(parts[1:]) + skip
    assert parallel_decode(mixed, 1 << 20) == data


def test_a_frame_that_declares_a_huge_size_is_refused_before_decoding():
    header_only = zstandard.ZstdCompressor(level=1).compress(b"x" * (frames.FRAME_MAX + 1))
    small = zstandard.ZstdCompressor(level=1, write_checksum=True).compress(b"y" * 1000)
    with pytest.raises(frames.FrameError, match="declares"):
        parallel_decode(small + header_only, 1 << 20)


def test_frame_length_needs_the_whole_frame():
    frame = zstandard.ZstdCompressor(level=1, write_checksum=True).compress(os.urandom(300000))
    assert frames.frame_length(frame) == len(frame)
    for cut in (0, 3, 5, 10, len(frame) // 2, len(frame) - 1):
        assert frames.frame_length(frame[:cut]) is None


def test_a_frame_that_never_ends_is_refused_before_it_fills_memory():
    frame = zstandard.ZstdCompressor(level=1, write_checksum=True).compress(b"z" * 1000)
    header = frame[:zstandard.frame_header_size(frame)]
    raw_block = (((1 << 17) << 3) | (0 << 1) | 0).to_bytes(3, "little") + b"r" * (1 << 17)  # not the last block
    dec = frames.ParallelDecoder(lambda view, release: release())
    with pytest.raises(frames.FrameError, match="runs past"):
        dec.feed(header)
        for _ in range(frames.FRAME_MAX // (1 << 17) + 10):
            dec.feed(raw_block)
    dec.close()
