"""Large blobs end to end: several zstd frames at publish, checked by the service, verified by restore.

Runs on both storage backends (local: the body goes through the service's
PUT; S3: presigned, read back at commit).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import requests
import zstandard

from cachesvc.storage import blob_key
from cachesvc_client import CacheClient
from cachesvc_client.codec import frames
from tests.helpers.client import blob_bytes, enter_container, write
from tests.helpers import ENV, sha, zstd_target

pytestmark = pytest.mark.backends("storage")  # through the service (local), or presigned and read back (S3)

NAME, SHAPE = "big", "f32[1]"
GCH = "cache/sj/cpp_prefix.h.gch"


def client_for(url: str) -> CacheClient:
    return CacheClient(url, timeout=30)


@pytest.fixture
def big(live_server, tmp_path, monkeypatch):
    """A cache with one 40 MiB file (several frames) and one small file, published; (server, data)."""
    a = enter_container(monkeypatch, tmp_path / "a")
    data = blob_bytes(frames.FRAMED_MIN + (8 << 20) + 777)
    write(a / GCH, data)
    write(a / "cache/sj/small.cpp", b"int x;" * 100)
    report = client_for(live_server.url).publish(NAME, SHAPE, env=ENV)
    assert report.status == "committed" and report.files == 2
    return live_server, data


def storage_of(server):
    return server.app.extensions["cachesvc"].storage


def resolve(server) -> dict:
    client = client_for(server.url)
    return client.api.resolve(client.key(NAME, SHAPE, {}, ENV))


def replace_stored(server, digest: str, body: bytes, tmp_path: Path) -> None:
    """Overwrite the stored object behind the service's back (someone with write access to the bucket)."""
    tmp = tmp_path / "replacement"
    tmp.write_bytes(body)
    storage_of(server).put_file(blob_key(digest, "zstd"), str(tmp))


def restore_into(server, tmp_path, monkeypatch, name: str):
    b = enter_container(monkeypatch, tmp_path / name)
    return b, client_for(server.url).restore(NAME, SHAPE, env=ENV)


def test_large_blob_is_stored_as_frames_checked_by_the_service_and_restored(big, tmp_path, monkeypatch):
    server, data = big
    answer = resolve(server)
    blob = answer["blobs"][sha(data)]
    assert blob["encoding"] == "zstd" and blob["size"] == len(data)
    with storage_of(server).open(blob_key(sha(data), "zstd")) as body:
        stored = body.read()
    assert blob["stored_sha256"] == hashlib.sha256(stored).hexdigest()  # what the service read and decoded
    assert blob["stored_size"] == len(stored)
    assert frames.parallel_ok(stored[:18]) and frames.frame_length(stored) < len(stored)  # several frames
    small = answer["blobs"][sha(b"int x;" * 100)]
    assert set(small) >= {"url", "encoding", "size", "stored_size"}  # the fields older clients read
    registry = server.app.extensions["cachesvc_metrics"].registry
    bytes_in = {via: registry.get_sample_value("cachesvc_blob_bytes_in_total", {"via": via}) or 0
                for via in ("service", "storage")}
    if storage_of(server).upload_target("probe", 60, 1) is None:
        assert bytes_in["service"] >= len(stored), bytes_in
    else:  # issue 37: presigned for the length the client stated once it had compressed, straight to the bucket
        assert bytes_in["service"] == 0 and bytes_in["storage"] >= len(stored), bytes_in
    b, report = restore_into(server, tmp_path, monkeypatch, "b")
    assert report.hit and not report.failed and report.files == 2
    assert (b / GCH).read_bytes() == data
    assert not list(b.rglob("*.tmp"))


@pytest.mark.parametrize("how", ["other content", "garbage", "truncated"])
def test_tampered_stored_object_is_detected_and_not_placed(big, tmp_path, monkeypatch, how):
    server, data = big
    digest = sha(data)
    evil = bytearray(data)
    evil[len(evil) // 2] ^= 0xFF
    body = {"other content": b"".join(frames.compress_framed([bytes(evil)[i:i + frames.FRAME_SIZE] for i in
                                                              range(0, len(evil), frames.FRAME_SIZE)], 3)),
            "garbage": b"\x28\xb5\x2f\xfd" + b"x" * 5000,
            "truncated": None}[how]
    if body is None:
        with storage_of(server).open(blob_key(digest, "zstd")) as f:
            body = f.read()[:-70000]
    replace_stored(server, digest, body, tmp_path)
    b, report = restore_into(server, tmp_path, monkeypatch, "b")
    assert report.hit and len(report.failed) == 1 and "cpp_prefix.h.gch" in report.failed[0], report.failed
    assert not (b / GCH).exists()
    assert (b / "cache/sj/small.cpp").exists()
    assert not list(b.rglob("*.tmp"))


def test_same_content_stored_again_as_one_frame_still_restores(big, tmp_path, monkeypatch):
    """Another publisher (an older client) re-uploading the blob as one frame: the stored sha256 no longer
    matches, so the client hashes the decoded file in full and places it since it is right."""
    server, data = big
    replace_stored(server, sha(data), zstandard.ZstdCompressor(level=1).compress(data), tmp_path)
    b, report = restore_into(server, tmp_path, monkeypatch, "b")
    assert report.hit and not report.failed
    assert (b / GCH).read_bytes() == data


@pytest.mark.parametrize("frames_of", [None, 3 << 20], ids=["one frame", "3 MiB frames"])
def test_service_accepts_a_large_blob_in_any_frame_layout(app, client, frames_of):
    """An older publisher's single frame and another frame size both pass the service's check."""
    from tests.helpers import publish_body, put_blob

    data = blob_bytes(frames.FRAMED_MIN + 5000, seed=frames_of or 0)
    cctx = zstandard.ZstdCompressor(level=1)
    body = cctx.compress(data) if frames_of is None else b"".join(
        cctx.compress(data[i:i + frames_of]) for i in range(0, len(data), frames_of))
    answer = client.post("/api/v1/versions", json=publish_body({"big.bin": data})).json
    r = put_blob(client, zstd_target(client, answer, body), body)
    assert r.status_code in (200, 201)
    done = client.post(f"/api/v1/versions/{answer['version']['id']}/commit", json={"uploaded": [
        {"sha256": sha(data), "encoding": "zstd"}]})
    assert done.status_code == 200, done.json
    from tests.helpers import key, resolve_params

    got = client.get("/api/v1/resolve", query_string=resolve_params(key())).json
    assert got["blobs"][sha(data)]["stored_sha256"] == hashlib.sha256(body).hexdigest()


def test_a_bad_large_upload_is_refused_or_missing_at_commit(app, client):
    """Through the service: a 400 naming the problem. Presigned: the commit reads it back and calls it missing."""
    from tests.helpers import publish_body, put_blob

    data = blob_bytes(frames.FRAMED_MIN + 5000, seed=5)
    wrong = zstandard.ZstdCompressor(level=1).compress(data[:-1] + b"!")
    answer = client.post("/api/v1/versions", json=publish_body({"big.bin": data})).json
    target = zstd_target(client, answer, wrong)
    r = put_blob(client, target, wrong)
    commit = client.post(f"/api/v1/versions/{answer['version']['id']}/commit", json={})
    if target["url"].startswith("/"):
        assert r.status_code == 400 and "hashes to" in r.json["error"]["message"]
    else:
        assert isinstance(r, requests.Response) and r.status_code == 200
    assert commit.status_code == 409 and commit.json["error"]["code"] == "blobs_missing", commit.json
    assert sha(data) in str(commit.json["error"].get("details"))


def test_a_single_frame_blob_from_an_older_publisher_restores(live_server, tmp_path, monkeypatch):
    """Published as one zstd frame (the 0.1 client): checked by the service, decoded as one stream, verified."""
    from tests.helpers import publish_body, put_blob

    app_client = live_server.app.test_client()
    app_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {live_server.app.config['TOKENS']['write']}"
    data = blob_bytes(frames.FRAMED_MIN + 4321, seed=9)
    stream = zstandard.ZstdCompressor(level=3).compressobj()
    body = stream.compress(data) + stream.flush()  # no content size in the header, as stream_writer wrote it
    k = {"name": NAME, "shape": SHAPE, "tags": {}, "env": ENV}
    pub = publish_body({"sj/old.h.gch": data}, k, kind="inductor-dir", merge=False)
    pub["roots"] = {"inductor": str(tmp_path / "a" / "cache")}
    answer = app_client.post("/api/v1/versions", json=pub).json
    assert put_blob(app_client, zstd_target(app_client, answer, body), body).status_code in (200, 201)
    assert app_client.post(f"/api/v1/versions/{answer['version']['id']}/commit", json={}).status_code == 200
    assert resolve(live_server)["blobs"][sha(data)]["stored_sha256"] == hashlib.sha256(body).hexdigest()
    b, report = restore_into(live_server, tmp_path, monkeypatch, "b")
    assert report.hit and not report.failed and report.files == 1
    assert (b / "cache/sj/old.h.gch").read_bytes() == data
