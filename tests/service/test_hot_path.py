"""The resolve hot path: no writes in the request, counters flushed within seconds, token and URL caches."""
from __future__ import annotations

import time

import pytest
import requests
from sqlalchemy import event, select

from cachesvc.resolve.hits import HitLog
from cachesvc.models import Entry, Event, Token, Version, utcnow
from cachesvc.storage import blob_key
from cachesvc.ttlcache import TTLCache
from tests.helpers import key, publish, resolve_params
from tests.helpers.service import with_token

pytestmark = pytest.mark.backends("database")  # the counters' flush is an upsert written per dialect


def _counts(app):
    with app.extensions["cachesvc"].db.session() as s:
        entry = s.scalars(select(Entry)).one()
        version = s.scalars(select(Version).where(Version.state == "committed")).one()
        hits = len(s.scalars(select(Event).where(Event.kind == "hit")).all())
        return entry, version, hits


def _wait_for(check, seconds: float = 10.0):
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not written in time"
        time.sleep(0.05)


def test_a_hit_reads_two_queries_and_writes_nothing_in_the_request(app, client):
    publish(client, {"a": b"1", "b": b"2", "c": b"3"})
    svc = app.extensions["cachesvc"]
    svc.hits, svc.tokens = HitLog(svc.db, 3600), TTLCache(60)
    client.get("/api/v1/stats")  # the token lookup, now cached
    statements = []
    event.listen(svc.db.engine, "before_cursor_execute",
                 lambda conn, cur, sql, params, ctx, many: statements.append(sql.split()[0].upper()))
    answer = client.get("/api/v1/resolve", query_string=resolve_params(key())).json
    assert answer["hit"] is True and len(answer["files"]) == 3 and len(answer["blobs"]) == 3
    assert statements.count("SELECT") == 2  # entry + newest version, files + blobs
    assert not {"INSERT", "UPDATE", "DELETE"} & set(statements), statements
    assert svc.hits.pending() == 1
    svc.hits.close()
    assert _counts(app)[2] == 1


def test_restore_counters_are_flushed_within_seconds(app, client):
    publish(client, {"a": b"1"})
    svc = app.extensions["cachesvc"]
    svc.hits = HitLog(svc.db, 0.2)
    before = utcnow().replace(microsecond=0)
    for _ in range(3):
        assert client.get("/api/v1/resolve", query_string=resolve_params(key())).json["hit"] is True
    _wait_for(lambda: _counts(app)[2] == 3)
    entry, version, _ = _counts(app)
    assert entry.restore_count == version.restore_count == 3
    assert entry.last_restored_at >= before and version.last_restored_at >= before
    assert client.get("/api/v1/entries").json["entries"][0]["restore_count"] == 3
    assert client.get("/api/v1/stats").json["restores"] == 3
    svc.hits.close()


def test_counters_are_flushed_at_close_and_never_move_last_restored_back(app, client):
    publish(client, {"a": b"1"})
    svc = app.extensions["cachesvc"]
    entry, version, _ = _counts(app)
    newer, older = HitLog(svc.db, 3600), HitLog(svc.db, 3600)  # two serving processes
    older.record(entry.id, version.id, 1, None)
    time.sleep(0.01)
    newer.record(entry.id, version.id, 1, None)
    newer.close()
    newest = _counts(app)[0].last_restored_at
    older.close()  # flushes last, with an older hit
    entry, version, hits = _counts(app)
    assert (entry.restore_count, version.restore_count, hits) == (2, 2, 2)
    assert entry.last_restored_at == newest and version.last_restored_at == newest
    assert newer.flush() == 0


def test_a_failed_flush_keeps_its_hits_for_the_next(app, client, tmp_path):
    publish(client, {"a": b"1"})
    svc = app.extensions["cachesvc"]
    entry, version, _ = _counts(app)
    hits = HitLog(svc.db, 3600)
    hits.record(entry.id, version.id, 1, None)
    hits.record(entry.id, version.id, 1, None)
    (tmp_path / "empty.db").touch()
    hits._db = type(svc.db)(f"sqlite:///{tmp_path / 'empty.db'}")  # a database without the tables
    with pytest.raises(Exception):
        hits.flush()
    assert hits.pending() == 2
    hits._db = svc.db
    assert hits.flush() == 2
    assert _counts(app)[0].restore_count == 2


def test_a_token_revoked_elsewhere_stops_working_within_the_cache_time(app, tokens):
    svc = app.extensions["cachesvc"]
    svc.tokens = TTLCache(0.5)
    c = with_token(app, tokens["read"])
    assert c.get("/api/v1/entries").status_code == 200
    with svc.db.session() as s:  # what `cachesvc token revoke` in another process does
        s.scalars(select(Token).where(Token.name == "test-read")).one().revoked_at = utcnow()
    _wait_for(lambda: c.get("/api/v1/entries").status_code == 401, seconds=2)


def test_a_token_revoked_through_this_process_stops_at_once(app, tokens):
    svc = app.extensions["cachesvc"]
    svc.tokens = TTLCache(3600)
    c = with_token(app, tokens["read"])
    assert c.get("/api/v1/entries").status_code == 200
    assert with_token(app, tokens["admin"]).delete("/api/v1/admin/tokens/test-read").status_code == 200
    assert c.get("/api/v1/entries").status_code == 401
    c.environ_base["HTTP_AUTHORIZATION"] = "Bearer cs_unknown"
    assert c.get("/api/v1/entries").status_code == 401


def test_ttl_cache_expires_and_evicts():
    now = [0.0]
    cache = TTLCache(10, size=2, clock=lambda: now[0])
    cache.put("a", 1)
    cache.put("b", 2, ttl=1)
    assert cache.get("a") == 1 and cache.get("b") == 2
    now[0] = 1.0
    assert cache.get("b") is None and cache.get("a") == 1
    cache.put("c", 3)
    cache.put("d", 4)  # evicts the least recently used: a
    assert cache.get("a") is None and cache.get_or_make("c", lambda: 0) == 3
    assert TTLCache(0).get_or_make("x", lambda: 5) == 5 and TTLCache(0).get("x") is None


@pytest.mark.parametrize("storage_settings", ["s3"], indirect=True)
def test_presigned_urls_are_reused_and_still_fetch(app, client):
    publish(client, {"a": b"payload"})
    answers = [client.get("/api/v1/resolve", query_string=resolve_params(key())).json for _ in range(2)]
    urls = [next(iter(a["blobs"].values()))["url"] for a in answers]
    assert urls[0] == urls[1] and urls[0].startswith("http")
    assert requests.get(urls[0], timeout=10).status_code == 200
    digest, blob = next(iter(answers[0]["blobs"].items()))
    assert "X-Amz-Expires=60&" in app.extensions["cachesvc"].storage.download_url(blob_key(digest, blob["encoding"]), 60)


def test_get_urls_are_signed_as_botocore_signs_them(s3_server):
    """Same URL as generate_presigned_url (date and signature aside), public endpoint and odd keys included."""
    import re

    from cachesvc.storage.s3 import S3Storage

    settings = s3_server.settings(s3_server.new_bucket())
    bucket, prefix = settings["STORAGE_URL"][len("s3://"):].split("/", 1)
    store = S3Storage(bucket, prefix, endpoint_url=settings["S3_ENDPOINT_URL"], region=settings["S3_REGION"],
                      access_key=settings["S3_ACCESS_KEY_ID"], secret_key=settings["S3_SECRET_ACCESS_KEY"],
                      public_endpoint_url="http://cache.example:9000/")
    key = "v1/blobs/ab/a b+c~d%e.zst"
    ours = store.download_url(key, 600)
    theirs = store._signer.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": store._key(key)},
                                                  ExpiresIn=600)
    strip = re.compile(r"X-Amz-(Date|Signature)=[^&]*")
    assert ours.startswith(f"http://cache.example:9000/{bucket}/") and strip.sub("", ours) == strip.sub("", theirs)
