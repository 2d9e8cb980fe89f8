"""Publish packs small blobs, restore reads them back (whole or by Range), dedup holds across versions.
CacheClient against a live service on both storage backends."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import select

from cachesvc.models import Blob, Pack
from cachesvc_client import CacheClient
from cachesvc_client.codec import packing
from cachesvc_client.transport import blobs
from tests.helpers import ENV, sha

pytestmark = pytest.mark.backends("storage")  # packs restored whole or by Range from each backend

NAME, SHAPE = "packed", "f32[4]"


def fill(root: Path, n: int = 40, seed: int = 0) -> dict:
    """``n`` small files (some compressible) and one large one under ``root``; {relative path: bytes}."""
    files = {}
    for i in range(n):
        data = (f"kernel {seed}-{i}\n".encode() * (50 + 37 * i)) if i % 2 else os.urandom(1000 + 100 * i)
        files[f"{i % 5:02d}/k{seed}-{i}.py"] = data
    files["big/kernel.bin"] = os.urandom(300 << 10)  # over the 256 KiB pack limit: travels loose
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def client(url: str, cache: Path) -> CacheClient:
    return CacheClient(url, timeout=10, cache_dir=str(cache))


def read_all(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and ".cachesvc" not in p.parts}


@pytest.fixture
def spy(monkeypatch):
    """The byte ranges restore asks of packs (None: the whole pack); the real fetch runs."""
    seen = []
    real = blobs.fetch_bytes

    def fetch_bytes(url, headers, byte_range, *args, **kw):
        seen.append(byte_range)
        return real(url, headers, byte_range, *args, **kw)

    monkeypatch.setattr(blobs, "fetch_bytes", fetch_bytes)
    return seen


def test_small_blobs_travel_in_packs_and_come_back_whole(live_server, tmp_path, spy):
    src = tmp_path / "a"
    files = fill(src)
    pub = client(live_server.url, src).publish(NAME, SHAPE, env=ENV, roots={"inductor": str(src)})
    assert pub.status == "committed" and pub.uploaded_packs == 1 and pub.uploaded_blobs == len(files)
    answer = client(live_server.url, src).api.resolve(client(live_server.url, src).key(NAME, SHAPE, {}, ENV))
    packed = [d for d, b in answer["blobs"].items() if b.get("pack")]
    assert len(packed) == len(files) - 1 and not answer["blobs"][sha(files["big/kernel.bin"])].get("pack")

    dest = tmp_path / "b"
    report = client(live_server.url, dest).restore(NAME, SHAPE, env=ENV, strict=True)
    assert report.hit and not report.failed and report.files == len(files)
    assert read_all(dest) == files
    assert spy == [None], "a small, wholly wanted pack is fetched whole, in one GET"


def test_a_partly_wanted_pack_is_read_by_range(live_server, tmp_path, spy, monkeypatch):
    src = tmp_path / "a"
    files = fill(src)
    client(live_server.url, src).publish(NAME, SHAPE, env=ENV, roots={"inductor": str(src)})
    dest = tmp_path / "b"
    keep = sorted(files)[::3]  # most files are there already: only a third of the members are wanted
    for rel in files:
        if rel not in keep:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(files[rel])
    monkeypatch.setattr(packing, "MERGE_GAP", 1)  # no merging over gaps: one Range per wanted member
    report = client(live_server.url, dest).restore(NAME, SHAPE, env=ENV, strict=True)
    assert report.hit and not report.failed
    assert read_all(dest) == files
    ranged = [r for r in spy if r is not None]
    assert ranged and len(ranged) == len(spy), "only Range GETs"
    assert sum(hi - lo for lo, hi in ranged) < sum(b.stat().st_size for b in dest.rglob("*") if b.is_file()) // 2


def test_runs_merge_small_gaps_and_stay_bounded():
    def entry(offset, size):
        return {"offset": offset, "stored_size": size}

    members = [("a", entry(0, 100)), ("b", entry(150, 100)), ("c", entry(200_000, 100))]
    assert [r for r, _ in packing.runs(members, pack_size=10 << 20)] == [(0, 250), (200_000, 200_100)]
    assert packing.runs(members[:2], pack_size=300)[0][0] is None  # mostly wanted and small: whole
    many = [(str(i), entry(i * (1 << 20), 1 << 20)) for i in range(10)]
    assert all(hi - lo <= packing.RUN_BYTES for (lo, hi), _ in packing.runs(many, pack_size=10 << 20))


def test_a_corrupted_member_fails_only_its_files(live_server, tmp_path):
    src = tmp_path / "a"
    files = fill(src)
    client(live_server.url, src).publish(NAME, SHAPE, env=ENV, roots={"inductor": str(src)})
    svc = live_server.app.extensions["cachesvc"]
    victim = sorted(files)[3]
    with svc.db.session() as s:
        blob = s.get(Blob, sha(files[victim]))
        pack, offset, length = blob.pack_digest, blob.pack_offset, blob.stored_size
    from cachesvc.storage import pack_key

    key = pack_key(pack)
    data = bytearray(svc.storage.read_range(key, 0, svc.storage.stat(key)))
    data[offset:offset + length] = b"X" * length
    tmp = tmp_path / "bad-pack"
    tmp.write_bytes(bytes(data))
    svc.storage.put_file(key, str(tmp))  # the object changes under its name: storage rot, a bad disk

    dest = tmp_path / "b"
    report = client(live_server.url, dest).restore(NAME, SHAPE, env=ENV)
    assert report.hit and len(report.failed) == 1 and victim.split("/")[-1] in report.failed[0]
    got = read_all(dest)
    assert victim not in got and got == {k: v for k, v in files.items() if k != victim}
    assert not list(dest.rglob("*.tmp"))


def test_a_second_publish_never_repacks_stored_blobs(live_server, tmp_path):
    src = tmp_path / "a"
    files = fill(src)
    first = client(live_server.url, src).publish(NAME, SHAPE, env=ENV, roots={"inductor": str(src)})
    svc = live_server.app.extensions["cachesvc"]
    with svc.db.session() as s:
        before = {b.digest: b.pack_digest for b in s.scalars(select(Blob))}
    extra = fill(src, n=3, seed=1)  # three new small files next to the old ones, and new big/kernel.bin
    second = client(live_server.url, src).publish(NAME, SHAPE, env=ENV, roots={"inductor": str(src)})
    assert first.uploaded_packs == 1 and second.status == "committed"
    assert second.uploaded_blobs == len(extra) and second.uploaded_packs == 1, "only the new files"
    with svc.db.session() as s:
        after = {b.digest: b.pack_digest for b in s.scalars(select(Blob))}
        new_pack = s.scalars(select(Pack.digest).where(Pack.digest.notin_(set(before.values()) - {None}))).one()
    assert {d for d, p in after.items() if p == new_pack} == {sha(v) for k, v in extra.items() if "big" not in k}
    assert {d: after[d] for d in before} == before, "stored blobs keep their pack"
    dest = tmp_path / "b"
    report = client(live_server.url, dest).restore(NAME, SHAPE, env=ENV, strict=True)
    assert read_all(dest) == {**files, **extra}
    assert report.files == len(set(files) | set(extra))
