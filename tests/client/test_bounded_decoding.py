"""Issue 15, item 1 (client): every decode stops at the declared size; a bomb costs a miss for its file.

A bomb here is 128 KiB of zstd that decodes to 4 GiB (RLE blocks, built by
hand in a blink), put in place of a committed object behind the service's
back (the local blob folder, or the rclone S3 bucket), in each shape the
client decodes: a small loose blob (decoded inline), a large one (decoded
into reused buffers on the pipeline), a framed one (frames decoded in
parallel) and a pack member (decoded in memory). The restore must place
every other file, leave the bomb's file out, raise nothing, write no more
than the files' own sizes (``/proc/self/io``: bytes passed to write()), and
the CLI must exit 0 with a small peak memory.

    -> test_a_bomb_in_storage_costs_only_its_file (local, S3; four shapes)
    -> test_the_cli_restores_past_a_bomb_with_exit_0_and_little_memory
    unit: test_decode_into_stops_one_byte_past_the_size, test_decode_bytes_never_allocates_a_declared_bomb,
          test_frames_may_not_declare_more_than_the_blob, test_a_window_over_the_cap_is_refused
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import zstandard

from cachesvc.storage import blob_key, pack_key
from cachesvc_client import CacheClient
from cachesvc_client.codec import decoding, frames
from cachesvc_client.errors import IntegrityError
from tests.helpers.client import blob_bytes
from tests.helpers import ENV, sha
from tests.helpers.restores import ENV_VARS, SHAPE, final_files, publish_files, temp_files, write_files
from tests.reliability.faults import client_env

pytestmark = pytest.mark.backends("storage")  # bombs placed in each backend's storage

NAME = "bombed"
GIB = 1 << 30
_RLE_BLOCK = 128 << 10  # zstd's largest block: an RLE block stores one byte for 128 KiB


def _rle_blocks(decoded: int) -> bytes:
    out, left = bytearray(), decoded
    while left:
        n = min(_RLE_BLOCK, left)
        left -= n
        out += ((n << 3) | (1 << 1) | (0 if left else 1)).to_bytes(3, "little") + b"\0"
    return bytes(out)


def bomb(decoded: int = 4 * GIB, declare: bool = False) -> bytes:
    """One zstd frame of ``decoded`` zero bytes in ~decoded/32768 bytes, with a 2 MiB window; its size is
    in the header only with ``declare`` (a decoder that trusts it allocates that much)."""
    magic, window = (0xFD2FB528).to_bytes(4, "little"), bytes([11 << 3])  # 2 ** (10 + 11)
    head = magic + bytes([3 << 6]) + window + decoded.to_bytes(8, "little") if declare else magic + b"\0" + window
    return head + _rle_blocks(decoded)


def framed_bomb(count: int = 2048, size: int = frames.FRAME_SIZE) -> bytes:
    """``count`` independent frames of ``size`` zeros each (4 GiB by default), sizes declared: parallel-decodable."""
    frame = (0xFD2FB528).to_bytes(4, "little") + bytes([(2 << 6) | (1 << 5)]) + size.to_bytes(4, "little")
    return (frame + _rle_blocks(size)) * count


def wchar() -> int:
    """Bytes this process has passed to write() so far."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


# -- the decoders, on their own ---------------------------------------------------------------------

def test_decode_into_stops_one_byte_past_the_size():
    import io

    data = blob_bytes(3 << 20)
    stored = zstandard.ZstdCompressor(level=3).compress(data)
    out = bytearray()

    def emit(view, release):
        out.extend(view)
        release()

    decoding.decode_into(io.BytesIO(stored), "zstd", len(data), what="ok", emit=emit,
                         buffers=decoding.single_buffer(len(data)))
    assert bytes(out) == data
    for size, error in ((len(data) - 1, decoding.Oversize), (len(data) + 1, IntegrityError)):
        out.clear()
        with pytest.raises(error):
            decoding.decode_into(io.BytesIO(stored), "zstd", size, what="blob", emit=emit,
                                 buffers=decoding.single_buffer(size))
        assert len(out) <= size  # never a byte past the declared size handed on
    out.clear()
    with pytest.raises(decoding.Oversize, match="decodes past"):
        decoding.decode_into(io.BytesIO(bomb()), "zstd", 1 << 20, what="bomb", emit=emit,
                             buffers=decoding.buffers(2, 256 << 10))
    assert len(out) <= 1 << 20
    with pytest.raises(decoding.Oversize, match="more stored bytes"):  # identity: the stored bytes are the bound
        reader = decoding.Limited(io.BytesIO(b"x" * 1001), 1000, "blob")
        decoding.decode_into(reader, "identity", 1000, what="blob", emit=emit, buffers=decoding.single_buffer(1000))


def test_decode_bytes_never_allocates_a_declared_bomb():
    member = bomb(3 * GIB, declare=True)
    tracemalloc.start()
    try:
        with pytest.raises(decoding.Oversize, match="declares 3221225472 bytes"):
            decoding.decode_bytes(member, "zstd", 200_000, what="member")
        with pytest.raises(IntegrityError):  # size not declared: decoded into size + 1 bytes at most
            decoding.decode_bytes(bomb(3 * GIB), "zstd", 200_000, what="member")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    small = b"kernel " * 1000
    assert decoding.decode_bytes(zstandard.ZstdCompressor().compress(small), "zstd", len(small), what="m") == small


def test_frames_may_not_declare_more_than_the_blob():
    emitted = []
    dec = frames.ParallelDecoder(lambda view, release: (emitted.append(len(view)), release()), limit=10 << 20)
    with pytest.raises(decoding.Oversize, match="decode past"):
        try:
            dec.feed(framed_bomb())
            dec.finish()
        finally:
            dec.close()
    assert sum(emitted) <= 10 << 20


def test_a_window_over_the_cap_is_refused():
    import io

    big_window = (0xFD2FB528).to_bytes(4, "little") + b"\0" + bytes([20 << 3]) + _rle_blocks(1 << 20)  # 1 GiB
    with pytest.raises(IntegrityError, match="bad zstd data"):
        decoding.decode_into(io.BytesIO(big_window), "zstd", 1 << 20, what="wide", emit=lambda v, r: r(),
                             buffers=decoding.single_buffer(1 << 20))


# -- against a live service, local storage and rclone S3 --------------------------------------------

@pytest.fixture
def database_url(sqlite_url):  # the bytes come from storage; one database is enough
    return sqlite_url


#: path -> content; each stored as the client decodes it (see the module docstring)
SHAPES = {
    "small loose": ("sj/small.cpp", lambda: blob_bytes(600_000, seed=2)),             # zstd, under 8 MiB
    "large loose": ("sj/large.h.gch", lambda: blob_bytes(9 << 20, seed=3)),           # zstd, one stream
    "framed": ("sj/framed.h.gch", lambda: blob_bytes(frames.FRAMED_MIN + 4096, seed=4)),  # zstd frames
    "pack member": ("fxgraph/k/member", lambda: os.urandom(150_000) + bytes(100_000)),  # zstd, packed
}


@pytest.fixture
def published(live_server, tmp_path):
    """Every shape plus a plain file, published; (client of the service, files)."""
    files = write_files(tmp_path / "src", {path: make() for path, make in SHAPES.values()}
                        | {"fxgraph/k/plain": b"plain " * 100})
    assert publish_files(live_server.url, None, tmp_path / "src", name=NAME).status == "committed"
    return CacheClient(live_server.url, timeout=30), files


def plant_bomb(live_server, client: CacheClient, data: bytes, shape: str, tmp_path: Path) -> None:
    """Replace the stored object behind ``data`` with a bomb, as someone with write access to the bucket."""
    storage = live_server.app.extensions["cachesvc"].storage
    entry = client.api.resolve(client.key(NAME, SHAPE, {}, ENV))["blobs"][sha(data)]
    assert entry["encoding"] == "zstd", entry
    body, key = (framed_bomb() if shape == "framed" else bomb()), blob_key(sha(data), "zstd")
    if shape == "pack member":
        key = pack_key(entry["pack_sha256"])
        with storage.open(key) as f:
            pack = bytearray(f.read())
        member = bomb(3 * GIB, declare=True)
        assert len(member) <= entry["stored_size"]
        pack[entry["offset"]:entry["offset"] + entry["stored_size"]] = member.ljust(entry["stored_size"], b"\0")
        body = bytes(pack)
    tmp = tmp_path / "planted"
    tmp.write_bytes(body)
    storage.put_file(key, str(tmp))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_bomb_in_storage_costs_only_its_file(published, live_server, tmp_path, shape):
    client, files = published
    victim = SHAPES[shape][0]
    plant_bomb(live_server, client, files[victim], shape, tmp_path)
    cache = tmp_path / "ctr"
    before = wchar()
    report = CacheClient(live_server.url, cache_dir=str(cache), timeout=30).restore(NAME, SHAPE, env=ENV)
    written = wchar() - before
    assert report.hit and len(report.failed) == 1 and victim in report.failed[0], report
    assert "refused" in report.failed[0], report.failed
    assert set(final_files(cache)) == set(files) - {victim}
    assert all((cache / rel).read_bytes() == files[rel] for rel in final_files(cache))
    assert not temp_files(cache)
    assert written < sum(map(len, files.values())) + (64 << 20), written  # never the bomb's GiBs


#: the CLI, reporting its own peak memory (KiB) and bytes written on the way out
CLI_MEASURED = ("import atexit, resource, sys\n"
                "def report():\n"
                "    io = dict(l.split(': ') for l in open('/proc/self/io').read().splitlines())\n"
                "    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
                "    sys.stderr.write(f\"PEAK {peak} WCHAR {io['wchar']}\\n\")\n"
                "atexit.register(report)\n"
                "from cachesvc_client.cli import main\n"
                "sys.argv[0] = 'cachesvc-client'\n"
                "main()\n")


def cli_restore(url: str, env: dict):
    """(exit code, report, peak KiB, bytes written, stderr) of a `cachesvc-client restore --json` process."""
    out = subprocess.run([sys.executable, "-c", CLI_MEASURED, "restore", "--name", NAME, "--shape", SHAPE, "--url",
                          url, "--json"], env=env, capture_output=True, text=True, timeout=120)
    peak, written = (int(v) for v in out.stderr.rsplit("PEAK ", 1)[1].split(" WCHAR "))
    return out.returncode, json.loads(out.stdout) if out.returncode == 0 else None, peak, written, out.stderr


@pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
def test_the_cli_restores_past_a_bomb_with_exit_0_and_little_memory(published, live_server, tmp_path):
    client, files = published
    token = {"CACHESVC_TOKEN": live_server.app.config["TOKENS"]["read"], **ENV_VARS}
    _, clean, clean_peak, _, _ = cli_restore(live_server.url, client_env(token, tmp_path / "clean"))
    assert clean["hit"] and not clean["failed"], clean
    for shape in ("large loose", "pack member", "framed"):
        plant_bomb(live_server, client, files[SHAPES[shape][0]], shape, tmp_path)
    env = client_env(token, tmp_path / "ctr")
    rc, report, peak, written, err = cli_restore(live_server.url, env)
    assert rc == 0 and "Traceback" not in err, err
    assert report["hit"] and len(report["failed"]) == 3, report
    # three 4 GiB bombs cost what a few decode buffers do (the baseline is this machine's process, torch and all)
    assert peak < clean_peak + (256 << 10), f"peak RSS {peak} KiB with the bombs, {clean_peak} KiB without"
    assert written < sum(map(len, files.values())) + (64 << 20), written
    assert not temp_files(Path(env["TORCHINDUCTOR_CACHE_DIR"]))


def test_a_bomb_does_not_stall_the_decoder_pool_for_later_restores(published, live_server, tmp_path):
    """After a refused framed bomb the shared decoder threads serve the next restore."""
    client, files = published
    plant_bomb(live_server, client, files[SHAPES["framed"][0]], "framed", tmp_path)
    first = CacheClient(live_server.url, cache_dir=str(tmp_path / "a"), timeout=30).restore(NAME, SHAPE, env=ENV)
    assert len(first.failed) == 1
    q: "queue.Queue[bytes]" = queue.Queue()
    dec = frames.ParallelDecoder(lambda view, release: (q.put(bytes(view)), release()), limit=4 << 20)
    data = blob_bytes(4 << 20, seed=8)
    dec.feed(b"".join(frames.compress_framed([data[:2 << 20], data[2 << 20:]], 3)))
    dec.finish()
    assert q.get_nowait() + q.get_nowait() == data
