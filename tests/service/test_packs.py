"""Packs of small blobs: commit verifies them, resolve points into them, old clients get slices, GC keeps or
deletes them whole, and a database at 0005 upgrades. On both storage backends (GC on both databases too)
unless marked."""
from __future__ import annotations

import datetime as dt
import hashlib

import pytest
import zstandard
from alembic import command
from sqlalchemy import create_engine, select, text

from cachesvc.lifecycle import collect
from cachesvc import db
from cachesvc.models import Blob, Pack, PendingPack, Version, utcnow
from cachesvc.storage import pack_key
from tests.helpers import get_blob, key, publish, resolve_params, sha
from tests.helpers.packs import FILES, build_pack, commit, publish_packed, start, upload_pack

pytestmark = pytest.mark.backends("storage")  # packs stored and ranged on each backend; GC on both axes

LOCAL = pytest.mark.parametrize("storage_settings", ["local"], indirect=True)


def test_good_pack_commits_and_resolve_points_into_it(client, app):
    resp, data, members = publish_packed(client, FILES)
    assert resp.status_code == 200 and resp.json["status"] == "committed", resp.json
    answer = client.get("/api/v1/resolve", query_string=resolve_params(key())).json
    assert answer["hit"]
    pack_urls = {b["pack"] for b in answer["blobs"].values()}
    assert len(pack_urls) == 1, "one URL per pack"
    whole = get_blob(client, pack_urls.pop())
    assert whole == data
    for m in members:
        b = answer["blobs"][m["sha256"]]
        assert (b["offset"], b["stored_size"], b["encoding"], b["size"]) == (
            m["offset"], m["stored_size"], m["encoding"], m["size"])
        assert b["pack_sha256"] == sha(data) and b["pack_size"] == len(data)
        # an older client knows only "url": the service serves the member's stored bytes alone
        assert b["url"] == f"/api/v1/blobs/{m['sha256']}"
        got = client.get(b["url"])
        assert got.status_code == 200 and got.headers["X-Cachesvc-Encoding"] == m["encoding"]
        assert got.data == data[m["offset"]:m["offset"] + m["stored_size"]]
    with app.extensions["cachesvc"].db.session() as s:
        assert s.get(Pack, sha(data)).stored_size == len(data)
        assert {b.pack_digest for b in s.scalars(select(Blob))} == {sha(data)}


@pytest.mark.parametrize("problem", ["tampered", "overlap", "wrong_size", "not_in_version", "missing"])
def test_bad_pack_fails_the_commit_and_records_nothing(client, app, problem):
    answer = start(client, FILES)
    vid = answer["version"]["id"]
    data, members = build_pack(FILES, tamper="b.so" if problem == "tampered" else None)
    if problem == "overlap":
        members[1]["offset"] -= 1
    elif problem == "wrong_size":
        members[0]["size"] += 1
    elif problem == "not_in_version":
        members[0]["sha256"] = sha(b"something else")
    if problem != "missing":
        upload_pack(client, vid, data)
    resp = commit(client, vid, [{"sha256": sha(data), "members": members}])
    if problem == "missing":
        assert resp.status_code == 409 and resp.json["error"]["details"]["missing_packs"] == [sha(data)]
    else:
        assert resp.status_code == 400, resp.json
        assert resp.json["error"]["code"] == "invalid_request"
    with app.extensions["cachesvc"].db.session() as s:
        assert s.scalar(select(Blob).limit(1)) is None and s.scalar(select(Pack).limit(1)) is None
        assert s.get(Version, vid).state == "pending"
    # the publisher can still commit it right
    good, good_members = build_pack(FILES)
    upload_pack(client, vid, good)
    assert commit(client, vid, [{"sha256": sha(good), "members": good_members}]).status_code == 200


def test_pack_put_checks_its_digest_and_version(client):
    answer = start(client, FILES)
    data, _ = build_pack(FILES)
    vid = answer["version"]["id"]
    wrong = client.put(f"/api/v1/packs/{sha(b'other')}?version={vid}", data=data)
    assert wrong.status_code == 400 and "hashes to" in wrong.json["error"]["message"]
    no_version = client.put(f"/api/v1/packs/{sha(data)}?version=999", data=data)
    assert no_version.status_code == 400
    bad_digest = client.put(f"/api/v1/packs/xyz?version={vid}", data=data)
    assert bad_digest.status_code == 400
    assert client.post("/api/v1/versions/999/packs", json={"packs": [{"sha256": sha(data), "size": 1}]}
                       ).status_code == 404


@LOCAL
def test_local_pack_answers_range_requests(client):
    resp, data, _ = publish_packed(client, FILES)
    part = client.get(f"/api/v1/packs/{sha(data)}", headers={"Range": "bytes=10-19"})
    try:
        assert part.status_code == 206 and part.data == data[10:20]
    finally:
        part.close()
    assert client.get(f"/api/v1/packs/{sha(b'nope')}").status_code == 404


def test_blobs_already_stored_are_not_packed_again(client, app):
    publish(client, {"loose.txt": FILES["c.json"]}, key(name="other"))  # stored loose by another key
    resp, data, members = publish_packed(client, FILES)
    assert resp.status_code == 200
    assert sha(FILES["c.json"]) not in {m["sha256"] for m in members}, "the service did not ask for it"
    answer = start(client, {**FILES, "new.txt": b"new"}, key(shape="f32[2]"))
    assert [u["sha256"] for u in answer["upload"]] == [sha(b"new")], "packed blobs count as stored"


@pytest.mark.backends  # both axes
def test_gc_keeps_a_partly_live_pack_whole_and_deletes_a_dead_one(client, app, storage):
    admin = app.test_client()
    admin.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {app.config['TOKENS']['admin']}"
    resp, data, members = publish_packed(client, FILES, key(name="first"))
    v1 = resp.json["version"]["id"]
    v2 = publish(client, {"a.py": FILES["a.py"]}, key(name="second"))["version"]["id"]  # a member, still live
    svc = app.extensions["cachesvc"]
    later = utcnow() + dt.timedelta(seconds=svc.settings.GC_GRACE_SECONDS + 60)

    assert admin.post("/api/v1/admin/purge", json={"name": "first"}).status_code == 200
    kept = collect.gc(svc.db, svc.storage, svc.settings, now=later)
    assert kept["packs_deleted"] == 0
    assert storage.stat(pack_key(sha(data))) == len(data)
    got = client.get(f"/api/v1/blobs/{sha(FILES['a.py'])}")
    assert got.status_code == 200 and zstandard.ZstdDecompressor().decompress(got.data) == FILES["a.py"]

    assert admin.post("/api/v1/admin/purge", json={"name": "second"}).status_code == 200
    gone = collect.gc(svc.db, svc.storage, svc.settings, now=later)
    assert gone["packs_deleted"] == 1 and gone["bytes_freed"] >= len(data)
    assert storage.stat(pack_key(sha(data))) is None
    with svc.db.session() as s:
        assert s.scalar(select(Pack).limit(1)) is None and s.scalar(select(Blob).limit(1)) is None
    assert v1 != v2


@LOCAL
def test_gc_keeps_a_pending_publishs_pack_and_sweeps_orphans_while_it_is_pending(client, app, storage, tmp_path):
    """A pack object with no row is an orphan unless a pending version is uploading it: GC sweeps the
    orphans even while publishes are pending (on a busy service some always are), keeps the pending
    one's pack until its version commits or its lease runs out."""
    answer = start(client, FILES)
    data, members = build_pack(FILES)
    upload_pack(client, answer["version"]["id"], data)
    stray = b"a pack whose publish died before this service recorded it"
    (tmp_path / "stray").write_bytes(stray)
    storage.put_file(pack_key(sha(stray)), str(tmp_path / "stray"))
    svc = app.extensions["cachesvc"]
    swept = collect.gc(svc.db, svc.storage, svc.settings)
    assert swept["orphan_packs_deleted"] == 1 and storage.stat(pack_key(sha(stray))) is None
    assert storage.stat(pack_key(sha(data))) == len(data), "the pending version's pack stays"

    # Its commit records the pack and drops the pending row; GC keeps the pack for the version.
    assert commit(client, answer["version"]["id"], [{"sha256": sha(data), "members": members}]).status_code == 200
    with svc.db.session() as s:
        assert s.scalar(select(PendingPack).limit(1)) is None
    assert collect.gc(svc.db, svc.storage, svc.settings)["orphan_packs_deleted"] == 0
    assert storage.stat(pack_key(sha(data))) == len(data)


@LOCAL
def test_gc_sweeps_the_pack_of_a_publish_whose_lease_ran_out(client, app, storage):
    answer = start(client, FILES)
    data, _ = build_pack(FILES)
    upload_pack(client, answer["version"]["id"], data)
    svc = app.extensions["cachesvc"]
    lease = dt.timedelta(seconds=svc.settings.UPLOAD_LEASE_SECONDS) + collect.LEASE_MARGIN
    expired = collect.gc(svc.db, svc.storage, svc.settings, now=utcnow() + lease + dt.timedelta(seconds=1))
    assert expired["versions_deleted"] == 1
    assert expired["orphan_packs_deleted"] == 1 and storage.stat(pack_key(sha(data))) is None
    with svc.db.session() as s:
        assert s.scalar(select(PendingPack).limit(1)) is None


def test_pack_targets_for_a_version_that_is_not_pending_are_refused(client):
    resp, data, _ = publish_packed(client, FILES)
    vid = resp.json["version"]["id"]
    again = client.post(f"/api/v1/versions/{vid}/packs", json={"packs": [{"sha256": sha(data), "size": len(data)}]})
    assert again.status_code == 400 and "committed" in again.json["error"]["message"], again.json
    assert client.post("/api/v1/versions/999999/packs",
                       json={"packs": [{"sha256": sha(data), "size": len(data)}]}).status_code == 404


def test_pack_targets_after_the_upload_lease_are_refused(client, app):
    answer = start(client, FILES)
    vid = answer["version"]["id"]
    svc = app.extensions["cachesvc"]
    with svc.db.session() as s:
        s.get(Version, vid).lease_expires_at = utcnow() - dt.timedelta(seconds=1)
    resp = client.post(f"/api/v1/versions/{vid}/packs", json={"packs": [{"sha256": "ab" * 32, "size": 10}]})
    assert resp.status_code == 409 and "upload lease" in resp.json["error"]["message"], resp.json
    with svc.db.session() as s:
        assert s.scalar(select(PendingPack).limit(1)) is None


def test_database_at_0005_with_data_upgrades(database_url):
    command.downgrade(db.alembic_config(database_url), "0005")
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO blobs (digest, size, stored_size, encoding, created_at) "
                              "VALUES (:d, 3, 3, 'identity', :t)"), {"d": "ab" * 32, "t": utcnow()})
    finally:
        engine.dispose()
    db.upgrade(database_url)
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(text("SELECT digest, pack_digest, pack_offset FROM blobs")).one()
            assert tuple(row) == ("ab" * 32, None, None)
            assert conn.execute(text("SELECT count(*) FROM packs")).scalar() == 0
        current, head = db.schema_status(engine)
        assert current == head == db.head_revision()
    finally:
        engine.dispose()


def test_pack_digest_names_the_bytes():
    data, _ = build_pack(FILES)
    assert pack_key(sha(data)) == f"v1/packs/{sha(data)[:2]}/{hashlib.sha256(data).hexdigest()}"


def test_remote_cache_reads_a_packed_blob_and_replaces_a_lost_pack(client, app, storage):
    resp, data, _ = publish_packed(client, FILES)
    value = FILES["c.json"]  # the same bytes as a pack member: stored already
    url = "/api/v1/remote-cache/fx-graph/pt2:fx-graph-v1::k:c1"
    assert client.put(url, query_string=key()["env"], data=value).status_code in (200, 201)
    got = client.get(url, query_string=key()["env"])
    assert got.status_code == 200 and got.data == value
    storage.delete(pack_key(sha(data)))  # the pack is lost: the next put stores the value loose
    assert client.put(url, query_string=key()["env"], data=value).status_code in (200, 201)
    got = client.get(url, query_string=key()["env"])
    assert got.status_code == 200 and got.data == value
    with app.extensions["cachesvc"].db.session() as s:
        assert s.get(Blob, sha(value)).pack_digest is None
