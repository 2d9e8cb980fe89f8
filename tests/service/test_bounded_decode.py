"""Issue 15, item 1 (service side): every decode stops at the declared size, with bounded memory.

    the decoder itself                 -> test_decoder_*
    PUT /api/v1/blobs with a bomb      -> test_a_blob_put_whose_body_decodes_past_its_size_is_400_and_stores_nothing
    a pack member bomb at commit       -> test_a_pack_member_that_decodes_past_its_size_fails_the_commit
    the S3 read-back at commit         -> test_a_large_presigned_upload_that_is_a_bomb_counts_as_missing_at_commit
    the live remote-cache read         -> test_a_remote_cache_object_replaced_by_a_bomb_is_a_counted_miss

Bombs are real zstd: frames of zeros, about 130 KiB for 4 GiB. The API tests run on both
storage backends and both databases and watch the Python heap (``tracemalloc``: the decoded
bytes are Python objects); tests/reliability/test_bombs.py watches a real worker's peak RSS.
"""
from __future__ import annotations

import contextlib
import os
import tracemalloc

import pytest
import zstandard
from sqlalchemy import select

from cachesvc.content import blobs
from cachesvc.storage.decoding import CHUNK, BadBlob, Decode, decode_all
from cachesvc.models import Blob
from cachesvc.storage import blob_key
from tests.helpers import ENV, key, put_blob, sha, zstd_bomb, zstd_target

pytestmark = pytest.mark.backends("storage")  # bombs read back from each storage backend

S3 = pytest.mark.parametrize("storage_settings", [pytest.param("s3", marks=pytest.mark.s3)], indirect=True)
#: what a bounded decode may add to the Python heap (one block and the request's own objects)
HEAP_BOUND = 48 << 20


@contextlib.contextmanager
def heap_peak():
    """Yields a dict whose "peak" is, afterwards, the most the Python heap grew inside the block."""
    out = {}
    tracemalloc.start()
    try:
        yield out
    finally:
        out["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


class Trickle:
    """A readable that hands out at most ``chunk`` bytes a read, as a network body does."""

    def __init__(self, raw: bytes, chunk: int):
        self.raw, self.pos, self.chunk = raw, 0, chunk

    def read(self, n: int = -1) -> bytes:
        n = self.chunk if n < 0 else min(n, self.chunk)
        out = self.raw[self.pos:self.pos + n]
        self.pos += len(out)
        return out


def decode_in_pieces(raw: bytes, encoding: str, limit: int, chunk: int = 1 << 20):
    """(decoded size, largest piece) of ``raw`` read ``chunk`` bytes at a time."""
    dec, largest = Decode(Trickle(raw, chunk), encoding, limit), 0
    for piece in dec:
        largest = max(largest, len(piece))
    return dec.size, largest


def wide_window_frame() -> bytes:
    """A frame that asks for a 64 MiB window (zstd would allocate it before decoding a byte)."""
    co = zstandard.ZstdCompressor(compression_params=zstandard.ZstdCompressionParameters(window_log=26)).compressobj()
    return co.compress(b"y" * 100) + co.flush()


# -- the decoder ----------------------------------------------------------------------------------

def test_decoder_stops_one_byte_past_the_declared_size():
    data = bytes(range(256)) * 4096
    for stored, enc in ((zstandard.ZstdCompressor(level=3).compress(data), "zstd"), (data, "identity")):
        assert decode_in_pieces(stored, enc, len(data))[0] == len(data)
        with pytest.raises(BadBlob, match=f"more than the declared {len(data) - 1} bytes"):
            decode_in_pieces(stored, enc, len(data) - 1)


@pytest.mark.parametrize("chunk", [1, 3, 4096, 1 << 20])
def test_decoder_reads_several_frames_fed_in_any_pieces(chunk):
    parts = [bytes([i]) * 300_000 + bytes(range(256)) * 100 for i in range(3)]
    cctx = zstandard.ZstdCompressor(level=3, write_checksum=True)
    stored = b"".join(cctx.compress(p) for p in parts)
    size, largest = decode_in_pieces(stored, "zstd", sum(map(len, parts)), chunk)
    assert size == sum(map(len, parts)) and largest <= CHUNK
    assert decode_all(stored, "zstd", size) == b"".join(parts)


def test_decoder_refuses_a_bomb_within_one_chunk_and_without_growing_the_heap():
    bomb = zstd_bomb(4 << 30)
    assert len(bomb) < 200 << 10
    with heap_peak() as heap, pytest.raises(BadBlob, match=f"more than the declared {1 << 20} bytes"):
        decode_in_pieces(bomb, "zstd", 1 << 20)
    assert heap["peak"] < 4 << 20
    one_frame = zstd_bomb(1 << 30, frame_mib=1024)  # one frame of 1 GiB: the bound holds inside a frame
    with heap_peak() as heap:
        size, largest = decode_in_pieces(one_frame, "zstd", 1 << 30)
    assert size == 1 << 30 and largest <= CHUNK and heap["peak"] < 4 << 20
    with pytest.raises(BadBlob):
        decode_in_pieces(one_frame, "zstd", (1 << 30) - 1)


@pytest.mark.parametrize("stored, problem", [
    (zstandard.ZstdCompressor(level=3).compress(b"x" * 5000) + b"tail", "not a valid zstd stream"),
    (zstandard.ZstdCompressor(level=3).compress(b"x" * 5000) + b"ta", "not a valid zstd stream"),
    (b"", "empty"),
    (b"not zstd at all", "not a valid zstd stream"),
    (zstandard.ZstdCompressor(level=1).compress(b"") * 20_000, "longer than any encoding"),  # empty frames
    (wide_window_frame(), "too much memory"),
])
def test_decoder_refuses_what_is_not_a_whole_bounded_stream(stored, problem):
    with pytest.raises(BadBlob, match=problem):
        decode_all(stored, "zstd", 10_000)


@pytest.mark.parametrize("stored", [
    zstandard.ZstdCompressor(level=3).compress(b"x" * 5000)[:-3],  # cut inside its last block
    (0x184D2A50).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc",  # a skippable frame only
])
def test_a_cut_or_foreign_stream_decodes_short_so_the_size_check_refuses_it(stored):
    """What a stream cut short or holding no content decodes to is less than declared: the callers'
    size and sha256 checks refuse it (the blob PUT test below shows the 400)."""
    assert len(decode_all(stored, "zstd", 5000)) < 5000


# -- the service's decodes --------------------------------------------------------------------------

def pending(client, files: dict) -> dict:
    """A pending version of ``files`` (path -> (sha256, size)); returns the create answer."""
    body = {"key": key(), "roots": {"inductor": "/cache/inductor"},
            "files": [{"root": "inductor", "path": p, "sha256": d, "size": n, "mode": 0o644}
                      for p, (d, n) in files.items()]}
    resp = client.post("/api/v1/versions", json=body)
    assert resp.status_code == 201, resp.json
    return resp.json


def no_blob(app, digest: str) -> bool:
    with app.extensions["cachesvc"].db.session() as s:
        return s.scalar(select(Blob.digest).where(Blob.digest == digest)) is None


def test_a_blob_put_whose_body_decodes_past_its_size_is_400_and_stores_nothing(client, app, storage):
    data = b"the real blob " * 80_000
    vid = pending(client, {"big.so": (sha(data), len(data))})["version"]["id"]
    with heap_peak() as heap:
        resp = client.put(f"/api/v1/blobs/{sha(data)}?encoding=zstd&version={vid}", data=zstd_bomb(4 << 30))
    assert resp.status_code == 400 and resp.json["error"]["code"] == "invalid_request", resp.json
    assert f"more than the declared {len(data)} bytes" in resp.json["error"]["message"]
    assert resp.json["error"]["details"]["declared_size"] == len(data)
    assert heap["peak"] < HEAP_BOUND
    assert storage.stat(blob_key(sha(data), "zstd")) is None and no_blob(app, sha(data))
    assert not [k for k in storage.iter_keys() if "upload" in k]
    good = client.put(f"/api/v1/blobs/{sha(data)}?encoding=zstd&version={vid}",
                      data=zstandard.ZstdCompressor().compress(data))
    assert good.status_code == 201, good.json  # the same PUT with the right bytes goes through


def test_a_pack_member_that_decodes_past_its_size_fails_the_commit(client, app, storage):
    small = b"a small graph" * 50
    answer = pending(client, {"g.py": (sha(small), len(small))})
    vid, bomb = answer["version"]["id"], zstd_bomb(1 << 30)
    member = {"sha256": sha(small), "offset": 0, "stored_size": len(bomb), "encoding": "zstd", "size": len(small)}
    target = client.post(f"/api/v1/versions/{vid}/packs", json={"packs": [{"sha256": sha(bomb), "size": len(bomb)}]})
    assert put_blob(client, target.json["targets"][0]["target"], bomb).status_code in (200, 201)
    with heap_peak() as heap:
        resp = client.post(f"/api/v1/versions/{vid}/commit", json={"packs": [{"sha256": sha(bomb),
                                                                             "members": [member]}]})
    assert resp.status_code == 400 and resp.json["error"]["code"] == "invalid_request", resp.json
    assert f"more than the declared {len(small)} bytes" in resp.json["error"]["details"]["problems"][0]
    assert heap["peak"] < HEAP_BOUND
    assert no_blob(app, sha(small))


@S3
def test_a_large_presigned_upload_that_is_a_bomb_counts_as_missing_at_commit(client, app, storage):
    size = blobs.VERIFY_AT_COMMIT_MIN + 12345  # large enough to be read back and decoded at commit
    digest = sha(b"z" * size)
    answer = pending(client, {"huge.gch": (digest, size)})
    bomb = zstd_bomb(4 << 30)
    target = zstd_target(client, answer, bomb)
    assert target["url"].startswith("http")  # presigned: the bytes go straight to the bucket
    assert put_blob(client, target, bomb).status_code == 200
    with heap_peak() as heap:
        resp = client.post(f"/api/v1/versions/{answer['version']['id']}/commit",
                           json={"uploaded": [{"sha256": digest, "encoding": "zstd"}]})
    assert resp.status_code == 409 and resp.json["error"]["code"] == "blobs_missing", resp.json
    assert resp.json["error"]["details"]["missing"] == [digest]
    assert heap["peak"] < HEAP_BOUND
    assert no_blob(app, digest)


def test_a_remote_cache_object_replaced_by_a_bomb_is_a_counted_miss(client, app, storage, tmp_path):
    url, value = "/api/v1/remote-cache/fx-graph/pt2:fx-graph-v1::bomb:c1", os.urandom(300_000)
    assert client.put(url, query_string=ENV, data=value).status_code == 201
    with app.extensions["cachesvc"].db.session() as s:
        stored_size = s.get(Blob, sha(value)).stored_size
    bomb = zstd_bomb(4 << 30)
    replaced = tmp_path / "bomb.zst"  # as long as the object it replaces: the decode itself must stop it
    replaced.write_bytes(bomb + b"\0" * (stored_size - len(bomb)))
    storage.put_file(blob_key(sha(value), "zstd"), str(replaced))  # a bucket writer replaces the object
    with heap_peak() as heap:
        resp = client.get(url, query_string=ENV)
    assert resp.status_code == 404 and resp.json["error"]["code"] == "not_found"
    assert heap["peak"] < HEAP_BOUND
    text = client.get("/metrics").data.decode()
    assert 'cachesvc_remote_cache_requests_total{cache="fx-graph",result="corrupt"} 1.0' in text
