"""Publish only what pays (linked content), merge on publish, and the verdicts restoring processes send."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from cachesvc.models import AuditRecord, Event, Version, VersionFile
from tests.helpers import key, publish, publish_body, put_blob, resolve_params, set_settings, sha

pytestmark = [pytest.mark.backends("database"),  # merge and verdicts under each database's transactions
              pytest.mark.parametrize("storage_settings", ["local"], indirect=True)]


def files_of(app, version_id) -> dict:
    with app.extensions["cachesvc"].db.session() as s:
        return {p: d for p, d in s.execute(select(VersionFile.path, VersionFile.digest)
                                           .where(VersionFile.version_id == version_id))}


def test_content_stored_under_another_key_is_linked_not_uploaded(client, app):
    data = {"a": b"a" * 500, "b": b"b" * 700}
    first = publish(client, data, key(shape="s1"))
    resp = client.post("/api/v1/versions", json=publish_body(data, key(shape="s2")))
    assert resp.status_code == 200, resp.json
    answer = resp.json
    assert answer["status"] == "linked" and answer["upload"] == []
    assert answer["linked_to"]["version_id"] == first["version"]["id"]
    assert answer["version"]["state"] == "committed" and answer["version"]["meta"]["linked_from"] == str(
        first["version"]["id"])
    hit = client.get("/api/v1/resolve", query_string=resolve_params(key(shape="s2"))).json
    assert hit["hit"] and {f["path"] for f in hit["files"]} == {"a", "b"}
    with app.extensions["cachesvc"].db.session() as s:
        assert s.scalar(select(func.count()).select_from(Event).where(Event.kind == "linked")) == 1
        assert s.scalar(select(func.count()).select_from(AuditRecord).where(AuditRecord.action == "publish")) == 2
    # the same again: unchanged, not a second link
    assert client.post("/api/v1/versions", json=publish_body(data, key(shape="s2"))).json["status"] == "unchanged"


def test_different_content_is_not_linked(client):
    publish(client, {"a": b"a"}, key(shape="s1"))
    answer = client.post("/api/v1/versions", json=publish_body({"a": b"a", "b": b"b"}, key(shape="s2"))).json
    assert answer["status"] == "pending"
    assert [u["sha256"] for u in answer["upload"]] and len(answer["upload"]) == 1  # "a" is stored already


def merged_publish(client, files, k=None):
    body = publish_body(files, k, merge=True)
    resp = client.post("/api/v1/versions", json=body)
    assert resp.status_code in (200, 201), resp.json
    answer = resp.json
    if answer["status"] == "pending":
        by_digest = {sha(d): d for d in files.values()}
        for item in answer["upload"]:
            assert put_blob(client, item["targets"]["identity"], by_digest[item["sha256"]]).status_code in (200, 201)
        answer = client.post(f"/api/v1/versions/{answer['version']['id']}/commit", json={}).json
    return answer


def test_merge_unions_with_the_newest_version_so_versions_do_not_fork(client, app):
    base = {"graph-x": b"x" * 100}
    v1 = publish(client, base)["version"]["id"]
    # two processes restored v1; one compiled shape y, the other shape z
    v2 = merged_publish(client, {**base, "graph-y": b"y" * 100})["version"]["id"]
    v3 = merged_publish(client, {**base, "graph-z": b"z" * 100})["version"]["id"]
    assert v1 < v2 < v3
    assert set(files_of(app, v3)) == {"graph-x", "graph-y", "graph-z"}  # not {x, z}: y is kept
    # a process that restored v1 and compiled nothing new publishes: no new version
    again = merged_publish(client, base)
    assert again["status"] == "unchanged" and again["version"]["id"] == v3
    # a publisher's own content wins at a path both have
    v4 = merged_publish(client, {"graph-x": b"X" * 100})["version"]["id"]
    got = files_of(app, v4)
    assert set(got) == {"graph-x", "graph-y", "graph-z"} and got["graph-x"] == sha(b"X" * 100)


def test_without_merge_the_newest_publish_replaces(client, app):
    publish(client, {"graph-x": b"x"})
    v2 = publish(client, {"graph-y": b"y"})["version"]["id"]
    assert set(files_of(app, v2)) == {"graph-y"}


def test_merge_keeps_roots_of_the_newest_version(client, app):
    body = publish_body({"a": b"a"})
    body["roots"]["pch"] = "/tmp/torchinductor_u"
    body["files"].append({"root": "pch", "path": "h.gch", "sha256": body["files"][0]["sha256"], "size": 1})
    resp = client.post("/api/v1/versions", json=body)
    put_blob(client, resp.json["upload"][0]["targets"]["identity"], b"a")
    assert client.post(f"/api/v1/versions/{resp.json['version']['id']}/commit", json={}).status_code == 200
    done = merged_publish(client, {"b": b"b"})
    assert done["version"]["roots"]["pch"] == "/tmp/torchinductor_u"
    assert set(files_of(app, done["version"]["id"])) == {"a", "b", "h.gch"}


def verdict(client, versions, result, fallback="", token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.post("/api/v1/verdicts", json={"versions": versions, "verdict": result, "fallback": fallback},
                       headers=headers)


def test_no_hit_verdicts_mark_a_problem_on_the_entries_api_and_pages(client, app, tokens):
    done = publish(client, {"a": b"a"})
    vid, eid = done["version"]["id"], done["version"]["entry_id"]
    resp = verdict(client, [vid], "paid_off", token=tokens["read"])  # restoring processes hold read tokens
    assert resp.status_code == 200, resp.json
    assert resp.json["versions"][0] == {"id": vid, "verify_count": 1, "no_hit_count": 0,
                                        "last_verdict": "paid_off", "problem": False}
    assert verdict(client, [vid], "no_hits").json["versions"][0]["problem"] is True
    rows = client.get("/api/v1/entries").json["entries"]
    assert rows[0]["problem"] is True
    assert client.get("/api/v1/entries?problem=true").json["total"] == 1
    assert client.get("/api/v1/entries?problem=false").json["total"] == 0
    detail = client.get(f"/api/v1/entries/{eid}").json
    assert detail["versions"][0]["no_hit_count"] == 1 and detail["versions"][0]["verify_count"] == 2
    page = client.get("/").get_data(as_text=True)
    assert "problem: no hits" in page
    assert "Problem: restores deliver files but no cache hit." in client.get(f"/entries/{eid}").get_data(as_text=True)
    assert "problem: no hits" in client.get("/?problem=1").get_data(as_text=True)
    # a later restore that pays off clears it
    verdict(client, [vid], "partial")
    assert client.get("/api/v1/entries").json["entries"][0]["problem"] is False


def test_fallback_verdicts_count_but_never_mark_a_problem(client):
    vid = publish(client, {"a": b"a"})["version"]["id"]
    row = verdict(client, [vid], "no_hits", fallback="shape").json["versions"][0]
    assert row == {"id": vid, "verify_count": 1, "no_hit_count": 0, "last_verdict": None, "problem": False}


@pytest.mark.parametrize("body, status", [
    ({"versions": [], "verdict": "no_hits"}, 422),
    ({"versions": [1], "verdict": "great"}, 422),
    ({"versions": [1], "verdict": "no_hits", "fallback": "nearby"}, 422),
    ({"versions": ["1"], "verdict": "no_hits"}, 422),
    ({"versions": [987654], "verdict": "no_hits"}, 404),
])
def test_bad_verdicts_get_4xx_and_record_nothing(client, app, body, status):
    vid = publish(client, {"a": b"a"})["version"]["id"]
    if status == 404:
        body = dict(body, versions=[vid, 987654])
    resp = client.post("/api/v1/verdicts", json=body)
    assert resp.status_code == status, resp.json
    with app.extensions["cachesvc"].db.session() as s:
        assert s.get(Version, vid).verify_count == 0


def test_two_merged_publishes_in_flight_at_once_keep_both_shapes(client, app):
    v1 = publish(client, {"graph-x": b"x" * 10})["version"]["id"]
    started = []
    for added in ("graph-y", "graph-z"):  # both created against v1, before either commits
        files = {"graph-x": b"x" * 10, added: added.encode()}
        answer = client.post("/api/v1/versions", json=publish_body(files, merge=True)).json
        assert answer["version"]["meta"]["merged_with"] == str(v1)
        for item in answer["upload"]:
            put_blob(client, item["targets"]["identity"], added.encode())
        started.append(answer["version"]["id"])
    first = client.post(f"/api/v1/versions/{started[0]}/commit", json={}).json
    second = client.post(f"/api/v1/versions/{started[1]}/commit", json={}).json
    assert first["status"] == second["status"] == "committed"
    assert set(files_of(app, started[1])) == {"graph-x", "graph-y", "graph-z"}
    assert second["version"]["file_count"] == 3 and second["version"]["meta"]["merged_with"] == str(started[0])
    hit = client.get("/api/v1/resolve", query_string=resolve_params(key())).json
    assert {f["path"] for f in hit["files"]} == {"graph-x", "graph-y", "graph-z"}


def _start_merged(client, files: dict) -> int:
    answer = client.post("/api/v1/versions", json=publish_body(files, merge=True)).json
    for item in answer["upload"]:
        put_blob(client, item["targets"]["identity"], next(d for d in files.values() if sha(d) == item["sha256"]))
    return answer["version"]["id"]


def test_the_newest_version_is_the_last_committed_and_holds_every_publishers_files(client, app):
    """Issue 15, item 4: three merged publishes created in order and committed in the reverse order; the
    first created commits last, takes in both others, and is what resolve answers (not the highest id)."""
    publish(client, {"graph-x": b"x" * 10})
    started = [_start_merged(client, {"graph-x": b"x" * 10, added: added.encode()})
               for added in ("graph-a", "graph-b", "graph-c")]
    for vid in reversed(started):
        assert client.post(f"/api/v1/versions/{vid}/commit", json={}).json["status"] == "committed"
    assert set(files_of(app, started[0])) == {"graph-x", "graph-a", "graph-b", "graph-c"}
    hit = client.get("/api/v1/resolve", query_string=resolve_params(key())).json
    assert hit["version"]["id"] == started[0]
    assert {f["path"] for f in hit["files"]} == {"graph-x", "graph-a", "graph-b", "graph-c"}


def test_merged_with_is_the_services_own(client, app):
    """Issue 15, item 7: a client's meta.merged_with is dropped (merge or not); a pending version holding a
    non-integer one (from before) gets a 400 naming the field at commit, not a 500."""
    v1 = publish(client, {"graph-x": b"x" * 10})["version"]["id"]
    plain = client.post("/api/v1/versions", json=publish_body({"graph-y": b"y"}, meta={"merged_with": "zz"})).json
    assert "merged_with" not in plain["version"]["meta"]
    merged = client.post("/api/v1/versions", json=publish_body({"graph-z": b"z"}, merge=True,
                                                               meta={"merged_with": "zz"})).json
    assert merged["version"]["meta"]["merged_with"] == str(v1)
    with app.extensions["cachesvc"].db.session() as s:
        s.get(Version, merged["version"]["id"]).meta = {"merged_with": "1e9"}
    put_blob(client, merged["upload"][0]["targets"]["identity"], b"z")
    resp = client.post(f"/api/v1/versions/{merged['version']['id']}/commit", json={})
    assert resp.status_code == 400 and "merged_with" in resp.json["error"]["message"], resp.json


@pytest.mark.parametrize("files, status, says", [({}, 400, "empty"),
                                                  ({".cachesvc/restored.json": b"{}"}, 422, ".cachesvc/")])
def test_an_empty_manifest_or_the_clients_state_files_are_refused(client, files, status, says):
    """Issue 15, item 10: an empty version would hide the key's good one; .cachesvc/ is the client's state."""
    good = publish(client, {"graph-x": b"x" * 10})["version"]["id"]
    for merge in (False, True):
        resp = client.post("/api/v1/versions", json=publish_body(files, merge=merge))
        assert resp.status_code == status and says in json.dumps(resp.json["error"]), resp.json
    assert client.get("/api/v1/resolve", query_string=resolve_params(key())).json["version"]["id"] == good


def test_anonymous_verdicts_count_but_never_mark_or_clear_a_problem(client, app, tokens):
    """Issue 15, item 10: with anonymous read on (the SQLite default), anyone who reaches the service could
    otherwise flag every version; only a verdict sent with a token (read scope is enough) sets it."""
    set_settings(app, ANONYMOUS_READ=True)  # the SQLite default; off on PostgreSQL
    vid = publish(client, {"a": b"a"})["version"]["id"]
    anonymous = app.test_client()
    resp = anonymous.post("/api/v1/verdicts", json={"versions": [vid], "verdict": "no_hits", "fallback": ""})
    assert resp.status_code == 200, resp.json
    assert resp.json == {"versions": [{"id": vid, "verify_count": 1, "no_hit_count": 0, "last_verdict": None,
                                       "problem": False}], "counted_toward_problem": False}
    assert client.get("/api/v1/entries?problem=true").json["total"] == 0

    marked = verdict(client, [vid], "no_hits", token=tokens["read"])
    assert marked.json["counted_toward_problem"] is True and marked.json["versions"][0]["problem"] is True
    anonymous.post("/api/v1/verdicts", json={"versions": [vid], "verdict": "paid_off", "fallback": ""})
    assert client.get("/api/v1/entries?problem=true").json["total"] == 1  # an anonymous paid_off clears nothing
