"""The publish / commit / resolve / browse API.

The publish, commit and resolve contract (``BACKENDS``) runs on every database x storage backend; what a
database refuses (``ON_BOTH_DATABASES``: integer ranges, NUL, control characters) on both databases; the
validation answered before any backend is reached on the default (SQLite, local), as tests/conftest.py says."""
from __future__ import annotations

import datetime as dt
import json

import pytest
import requests
import zstandard
from sqlalchemy import func, select, update

from cachesvc.models import Blob, Entry, Token, Version
from tests.helpers import (get_blob, key, publish, publish_body, put_blob, resolve_params, set_settings, sha,
                           zstd_target)

BACKENDS = pytest.mark.backends
FILES = {"fxgraph/ab/graph1": b"graph" * 100, "ab/cabc.py": b"code" * 300, "ab/cabc.so": b"\x7fELF" + bytes(5000)}


def count(app, model) -> int:
    with app.extensions["cachesvc"].db.session() as s:
        return s.scalar(select(func.count()).select_from(model))


@BACKENDS
def test_publish_then_resolve_returns_every_file_and_fetchable_blobs(client):
    k = key()
    done = publish(client, FILES, k)
    assert done["status"] == "committed"
    resp = client.get("/api/v1/resolve", query_string=resolve_params(k))
    assert resp.status_code == 200
    answer = resp.json
    assert answer["hit"] is True
    assert {f["path"] for f in answer["files"]} == set(FILES)
    for f in answer["files"]:
        blob = answer["blobs"][f["sha256"]]
        assert blob["encoding"] == "identity"
        assert get_blob(client, blob["url"]) == FILES[f["path"]]
    assert answer["version"]["total_bytes"] == sum(map(len, FILES.values()))


@BACKENDS
def test_zstd_upload_is_stored_compressed_and_served_as_stored(client):
    data = b"abc" * 10000
    body = publish_body({"big": data})
    answer = client.post("/api/v1/versions", json=body).json
    packed = zstandard.ZstdCompressor().compress(data)
    assert put_blob(client, zstd_target(client, answer, packed), packed).status_code in (200, 201)
    resp = client.post(f"/api/v1/versions/{answer['version']['id']}/commit",
                       json={"uploaded": [{"sha256": sha(data), "encoding": "zstd"}]})
    assert resp.status_code == 200, resp.json
    blob = client.get("/api/v1/resolve", query_string=resolve_params(key())).json["blobs"][sha(data)]
    assert blob["encoding"] == "zstd" and blob["stored_size"] == len(packed) and blob["size"] == len(data)
    assert zstandard.ZstdDecompressor().decompress(get_blob(client, blob["url"])) == data


@BACKENDS
def test_version_is_invisible_until_every_blob_is_stored(client, app):
    answer = client.post("/api/v1/versions", json=publish_body(FILES)).json
    first = answer["upload"][0]
    put_blob(client, first["targets"]["identity"], next(d for d in FILES.values() if sha(d) == first["sha256"]))
    resp = client.post(f"/api/v1/versions/{answer['version']['id']}/commit", json={})
    assert resp.status_code == 409
    assert resp.json["error"]["code"] == "blobs_missing"
    assert len(resp.json["error"]["details"]["missing"]) == len(FILES) - 1
    miss = client.get("/api/v1/resolve", query_string=resolve_params(key())).json
    assert miss == {"hit": False, "reason": "the entry has no committed version", "nearest": []}
    assert client.get("/api/v1/entries").json["total"] == 0


@BACKENDS
def test_identical_content_creates_no_version_and_uploads_nothing(client, app):
    first = publish(client, FILES)
    again = client.post("/api/v1/versions", json=publish_body(FILES))
    assert again.status_code == 200
    assert again.json["status"] == "unchanged"
    assert again.json["upload"] == []
    assert again.json["version"]["id"] == first["version"]["id"]
    assert count(app, Version) == 1


@BACKENDS
def test_second_publish_after_one_file_changed_uploads_that_file_alone(client):
    publish(client, FILES)
    changed = dict(FILES, **{"ab/cabc.py": b"new code" * 50})
    answer = client.post("/api/v1/versions", json=publish_body(changed)).json
    assert answer["status"] == "pending"
    assert [u["sha256"] for u in answer["upload"]] == [sha(changed["ab/cabc.py"])]


@BACKENDS
def test_a_file_shared_by_two_keys_is_stored_once(client, app):
    publish(client, FILES, key(shape="f32[8,256]"))
    second = publish(client, dict(FILES, extra=b"x" * 10), key(shape="f32[16,256]"))
    assert second["uploaded"] == [sha(b"x" * 10)]
    assert count(app, Blob) == len(FILES) + 1
    assert count(app, Entry) == 2


@BACKENDS
def test_concurrent_publishes_of_the_same_content_commit_one_version(client, app):
    a = client.post("/api/v1/versions", json=publish_body(FILES)).json
    b = client.post("/api/v1/versions", json=publish_body(FILES)).json
    assert a["status"] == b["status"] == "pending"
    for item in a["upload"]:
        put_blob(client, item["targets"]["identity"], next(d for d in FILES.values() if sha(d) == item["sha256"]))
    first = client.post(f"/api/v1/versions/{a['version']['id']}/commit", json={}).json
    second = client.post(f"/api/v1/versions/{b['version']['id']}/commit", json={}).json
    assert first["status"] == "committed"
    assert second["status"] == "unchanged" and second["version"]["id"] == first["version"]["id"]
    assert count(app, Version) == 1


@BACKENDS
def test_commit_after_the_upload_lease_expired_is_refused(client, app):
    answer = client.post("/api/v1/versions", json=publish_body(FILES)).json
    with app.extensions["cachesvc"].db.session() as s:
        s.execute(update(Version).values(lease_expires_at=dt.datetime(2000, 1, 1)))
    resp = client.post(f"/api/v1/versions/{answer['version']['id']}/commit", json={})
    assert resp.status_code == 409
    assert "lease" in resp.json["error"]["message"]


@BACKENDS
def test_resolve_matches_environment_shape_and_tags_exactly(client):
    k = key(tags={"mode": "default"})
    publish(client, FILES, k)
    assert client.get("/api/v1/resolve", query_string=resolve_params(k)).json["hit"] is True
    for other in (key(tags={"mode": "max-autotune"}), key(tags={}), key(shape="f32[16,256]"),
                  {**k, "env": {**k["env"], "torch": "2.13.1"}}, {**k, "env": {**k["env"], "device": "NVIDIA H200"}}):
        answer = client.get("/api/v1/resolve", query_string=resolve_params(other)).json
        assert answer["hit"] is False, other


@BACKENDS
def test_resolve_takes_the_newest_version_and_counts_restores(client):
    publish(client, {"a": b"1"})
    newest = publish(client, {"a": b"2"})
    answer = client.get("/api/v1/resolve", query_string=resolve_params(key())).json
    assert answer["version"]["id"] == newest["version"]["id"]
    client.get("/api/v1/resolve", query_string=resolve_params(key()))
    entry = client.get("/api/v1/entries").json["entries"][0]
    assert entry["restore_count"] == 2 and entry["last_restored_at"] is not None and entry["versions"] == 2


@BACKENDS
@pytest.mark.parametrize("field,value", [("name", "bert"), ("shape", "f32[1,1]"), ("torch", "2.12.0"),
                                         ("triton", "3.6.0"), ("cuda", "cuda-12.8"), ("python", "3.12"),
                                         ("device", "NVIDIA H200"), ("arch", "sm_90")])
def test_entries_filter_on_each_key_field(client, field, value):
    publish(client, {"a": b"1"}, key())
    publish(client, {"a": b"2"}, key(**{field: value}))
    rows = client.get("/api/v1/entries", query_string={field: value}).json
    assert rows["total"] == 1
    row = rows["entries"][0]
    assert (row[field] if field in ("name", "shape") else row["env"][field]) == value
    assert row["size"] == 1 and row["versions"] == 1


@BACKENDS
def test_entries_filter_on_tags_and_paginate(client):
    for i in range(5):
        publish(client, {"a": bytes([i])}, key(tags={"mode": "a" if i % 2 else "b"}, shape=f"f32[{i}]"))
    assert client.get("/api/v1/entries", query_string={"tags": json.dumps({"mode": "a"})}).json["total"] == 2
    page = client.get("/api/v1/entries", query_string={"limit": 2, "offset": 4}).json
    assert page["total"] == 5 and len(page["entries"]) == 1
    detail = client.get(f"/api/v1/entries/{page['entries'][0]['id']}").json
    assert len(detail["versions"]) == 1
    assert client.get("/api/v1/entries/999999").status_code == 404


@BACKENDS
def test_blob_upload_whose_bytes_do_not_match_is_refused_and_nothing_stored(client, app, storage):
    answer = client.post("/api/v1/versions", json=publish_body({"a": b"right"})).json
    digest = answer["upload"][0]["sha256"]
    resp = client.put(f"/api/v1/blobs/{digest}?encoding=identity", data=b"wrong")
    assert resp.status_code == 400
    assert "hashes to" in resp.json["error"]["message"]
    resp = client.put(f"/api/v1/blobs/{digest}?encoding=zstd", data=b"not zstd at all")
    assert resp.status_code == 400
    assert count(app, Blob) == 0
    assert [k for k in storage.iter_keys("v1/")] == []


@BACKENDS
def test_blob_upload_not_named_by_a_pending_version_is_refused(client, storage):
    resp = client.put(f"/api/v1/blobs/{sha(b'stray')}", data=b"stray")
    assert resp.status_code == 400
    assert "pending version" in resp.json["error"]["message"]
    assert list(storage.iter_keys("v1/")) == []


BAD = {
    "absolute path": lambda b: b["files"][0].update(path="/etc/passwd"),
    "dot-dot path": lambda b: b["files"][0].update(path="a/../../x"),
    "empty path": lambda b: b["files"][0].update(path=""),
    "overlong path": lambda b: b["files"][0].update(path="a/" * 600),
    "bad sha256": lambda b: b["files"][0].update(sha256="xyz"),
    "negative size": lambda b: b["files"][0].update(size=-1),
    "huge size": lambda b: b["files"][0].update(size=2**70),
    "size as string": lambda b: b["files"][0].update(size="12"),
    "unknown field": lambda b: b.update(surprise=1),
    "unknown env field": lambda b: b["key"]["env"].update(gpu="x"),
    "missing env field": lambda b: b["key"]["env"].pop("torch"),
    "empty name": lambda b: b["key"].update(name=""),
    "duplicate path": lambda b: b["files"].append(dict(b["files"][0])),
    "root not declared": lambda b: b["files"][0].update(root="pch"),
    "relative root path": lambda b: b.update(roots={"inductor": "cache"}),
    "two sizes for one sha": lambda b: b["files"].append(dict(b["files"][0], path="other", size=3)),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_manifest_gets_4xx_naming_the_problem_and_stores_nothing(client, app, case):
    body = publish_body({"a/b": b"data"})
    BAD[case](body)
    resp = client.post("/api/v1/versions", json=body)
    assert 400 <= resp.status_code < 500, resp.json
    err = resp.json["error"]
    assert err["code"] in ("invalid_request", "payload_too_large") and err["message"]
    assert count(app, Version) == 0


def test_malformed_json_and_wrong_content_type_get_4xx(client):
    resp = client.post("/api/v1/versions", data="{not json", content_type="application/json")
    assert 400 <= resp.status_code < 500 and "error" in resp.json
    resp = client.post("/api/v1/versions", data="key=1", content_type="application/x-www-form-urlencoded")
    assert 400 <= resp.status_code < 500 and "error" in resp.json


def test_too_many_files_is_refused(client, app):
    set_settings(app, MAX_FILES=3)
    resp = client.post("/api/v1/versions", json=publish_body({f"f{i}": bytes([i]) for i in range(4)}))
    assert resp.status_code == 413
    assert "CACHESVC_MAX_FILES" in resp.json["error"]["message"]


def test_resolve_with_bad_query_gets_4xx(client):
    resp = client.get("/api/v1/resolve", query_string={"name": "x"})
    assert resp.status_code == 422 and "shape" in resp.json["error"]["message"]
    resp = client.get("/api/v1/resolve", query_string={**resolve_params(key()), "tags": "[1,2]"})
    assert resp.status_code == 400 and "tags" in resp.json["error"]["message"]
    assert client.get("/api/v1/entries", query_string={"limit": "many"}).status_code == 422


def test_unknown_routes_and_versions_answer_json_404(client):
    assert client.get("/api/v1/versions/12345").json["error"]["code"] == "not_found"
    assert client.get("/api/v1/nothing").json["error"]["code"] == "not_found"
    assert client.get("/api/v1/blobs/" + "0" * 64).status_code == 404


def test_healthz_and_openapi_document(client):
    assert client.get("/healthz").json["status"] == "ok"
    spec = client.get("/api/v1/openapi.json").json
    assert spec["info"]["title"] == "cachesvc"
    paths = set(spec["paths"])
    for rule in client.application.url_map.iter_rules():
        if rule.rule.startswith("/api/v1/") and "openapi" not in rule.rule and "static" not in rule.endpoint \
                and not rule.rule.startswith("/api/v1/docs"):  # the browsable API's page and assets
            assert rule.rule.replace("<int:", "{").replace("<", "{").replace(">", "}") in paths, rule.rule


# -- Bad input at every door (issue 5, part 1): what the fuzzer found, and the doors it cannot knock on --


def ON_BOTH_DATABASES(test):
    """What a database refuses must be a 4xx on each: SQLite and PostgreSQL, local storage (storage plays no part)."""
    return pytest.mark.backends("database")(pytest.mark.parametrize("storage_settings", ["local"], indirect=True)(test))


def admin_client(app):
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {app.config['TOKENS']['admin']}"
    return c


def assert_json_error(resp, status, *words):
    assert resp.status_code == status, (resp.status_code, resp.get_data(as_text=True)[:300])
    assert resp.is_json and set(resp.json) == {"error"}, resp.get_data(as_text=True)[:300]
    for word in words:
        assert word in resp.json["error"]["message"], (word, resp.json["error"]["message"])


@ON_BOTH_DATABASES
@pytest.mark.parametrize("ident", [2**31, 2**63, 2**64])
def test_ids_beyond_the_id_columns_range_get_404_not_500(client, ident):
    # Found by the fuzzer: GET /api/v1/entries/9223372036854775808 was an OverflowError (SQLite) and
    # 3000000000 a DataError (PostgreSQL's int4): both 500s.
    assert_json_error(client.get(f"/api/v1/versions/{ident}"), 404, "does not exist")
    assert_json_error(client.get(f"/api/v1/entries/{ident}"), 404, "does not exist")
    assert_json_error(client.post(f"/api/v1/versions/{ident}/commit", json={}), 404, "does not exist")


@ON_BOTH_DATABASES
@pytest.mark.parametrize("ident", ["2147483648", "99999999999999999999", "%C2%B2", "%D9%A3"])
def test_revoking_a_token_by_an_out_of_range_or_non_ascii_digit_id_gets_404(app, ident):
    # Were 500s: int("99999999999999999999") overflowed the column, and '²' (or Arabic-Indic '٣')
    # passed str.isdigit() but not int().
    admin = admin_client(app)
    assert_json_error(admin.delete(f"/api/v1/admin/tokens/{ident}"), 404, "no active token")
    assert all(t["revoked_at"] is None for t in admin.get("/api/v1/admin/tokens").json["tokens"])


@ON_BOTH_DATABASES
@pytest.mark.parametrize("value", ["2.12\x00", "2.12\t", "\x7f"])
def test_env_values_with_control_characters_are_refused_as_the_client_refuses_them(client, app, value):
    # keys.check_env refuses them on the client; the service took them (and PostgreSQL then failed on NUL).
    k = key(torch=value)
    assert_json_error(client.post("/api/v1/versions", json=publish_body({"a": b"1"}, k)), 422, "torch",
                      "control characters")
    assert_json_error(client.get("/api/v1/resolve", query_string=resolve_params(k)), 422, "torch")
    assert count(app, Version) == 0 and count(app, Entry) == 0


@ON_BOTH_DATABASES
def test_values_the_database_refuses_get_400_not_500(app):
    # PostgreSQL refuses NUL in text (SQLite stores it): filters, purge criteria and token names that
    # carry one were 500s there. Either way: no 5xx, and an error names the problem.
    admin = admin_client(app)
    # filters, purge criteria and token names are printable text on every database (the schemas refuse
    # the rest), so the answer is the same 422 on SQLite, which would store NUL, and on PostgreSQL
    for resp in (admin.get("/api/v1/entries", query_string={"name": "a\x00b"}),
                 admin.post("/api/v1/admin/purge", json={"name": "a\x00b"}),
                 admin.post("/api/v1/admin/tokens", json={"name": "a\x00b", "scope": "read"})):
        assert_json_error(resp, 422, "control characters")
    assert count(app, Token) == 3  # the fixture's three


def test_deeply_nested_json_gets_400_not_500(client):
    # json.loads raised RecursionError, which webargs does not map: a 500.
    for body in ("[" * 100_000, '{"a":' * 100_000):
        assert_json_error(client.post("/api/v1/versions", data=body, content_type="application/json"), 400,
                          "nested too deeply")


def test_json_body_sent_as_another_content_type_gets_415_and_changes_nothing(client, app):
    # webargs took a non-JSON body as absent: a commit sent as text/plain went ahead without its
    # `uploaded` list, a purge said "needs a criterion" about a body that had one.
    data = b"abc" * 1000
    answer = client.post("/api/v1/versions", json=publish_body({"big": data})).json
    packed = zstandard.ZstdCompressor().compress(data)
    put_blob(client, zstd_target(client, answer, packed), packed)
    commit = json.dumps({"uploaded": [{"sha256": sha(data), "encoding": "zstd"}]})
    url = f"/api/v1/versions/{answer['version']['id']}/commit"
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "application/xml", None):
        resp = client.post(url, data=commit, content_type=ctype) if ctype else client.post(url, data=commit)
        assert_json_error(resp, 415, "application/json")
    assert client.get(f"/api/v1/versions/{answer['version']['id']}").json["state"] == "pending"
    admin = admin_client(app)
    resp = admin.post("/api/v1/admin/purge", data=json.dumps({"older_than": 0}), content_type="text/plain")
    assert_json_error(resp, 415, "text/plain")
    resp = admin.post("/api/v1/admin/tokens", data="name=x&scope=admin", content_type="application/x-www-form-urlencoded")
    assert_json_error(resp, 415)
    assert count(app, Token) == 3
    # JSON under another name is JSON; an empty body is no body.
    assert client.post(url, data=commit, content_type="application/json; charset=utf-8").status_code == 200
    assert admin.post("/api/v1/admin/gc", data=b"", content_type="text/plain").status_code == 200


def test_oversized_bodies_get_413_json_and_store_nothing(client, app, storage):
    set_settings(app, MAX_REQUEST_BYTES=4096)
    big = publish_body({f"f{i:04d}": bytes([i % 256]) for i in range(100)})
    assert len(json.dumps(big)) > 4096
    assert_json_error(client.post("/api/v1/versions", json=big), 413)
    assert_json_error(admin_client(app).post("/api/v1/admin/purge", json={"name": "x" * 70_000}), 413)
    assert count(app, Version) == 0
    # Blob bytes have their own limit (CACHESVC_MAX_BLOB_BYTES), whatever the content type.
    set_settings(app, MAX_BLOB_BYTES=100)
    data = b"y" * 500
    answer = client.post("/api/v1/versions", json=publish_body({"big": data})).json
    for ctype in ("application/octet-stream", "application/json"):
        assert_json_error(client.put(f"/api/v1/blobs/{sha(data)}", data=data, content_type=ctype), 413)
    assert count(app, Blob) == 0 and list(storage.iter_keys("v1/")) == []
    assert answer["status"] == "pending"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
def test_chunked_blob_upload_over_the_limit_gets_413_and_stores_nothing(live_server, app, storage):
    # No Content-Length to refuse up front: the limit must hold while the body streams.
    set_settings(app, MAX_BLOB_BYTES=1000)
    data = b"z" * 5000
    headers = {"Authorization": f"Bearer {app.config['TOKENS']['write']}"}
    answer = requests.post(f"{live_server.url}/api/v1/versions", json=publish_body({"z": data}), headers=headers,
                           timeout=30).json()
    resp = requests.put(f"{live_server.url}/api/v1/blobs/{sha(data)}", data=iter([data[:2500], data[2500:]]),
                        headers=headers, timeout=30)
    assert resp.status_code == 413 and resp.json()["error"]["message"], resp.text
    assert answer["status"] == "pending"
    assert count(app, Blob) == 0 and list(storage.iter_keys("v1/")) == []


QUERY_TYPES = [
    ("/api/v1/stats", {"days": "abc"}, "days"),
    ("/api/v1/stats", {"days": "1.5"}, "days"),
    ("/api/v1/stats", {"days": "0"}, "days"),
    ("/api/v1/entries", {"offset": "-1"}, "offset"),
    ("/api/v1/entries", {"offset": "1e3"}, "offset"),
    ("/api/v1/entries", {"limit": ""}, "limit"),
    ("/api/v1/entries", {"limit": "0"}, "limit"),
    ("/api/v1/entries", {"sort": "oldest"}, "sort"),
    ("/api/v1/entries", {"tag": "no-equals-sign"}, "tag"),
    ("/api/v1/admin/audit", {"limit": "ten"}, "limit"),
    ("/api/v1/admin/audit", {"offset": "true"}, "offset"),
    ("/api/v1/admin/audit", {"action": "delete"}, "action"),
    ("/api/v1/resolve", {**resolve_params(key()), "torch": ""}, "torch"),
]


@pytest.mark.parametrize("path,params,field", QUERY_TYPES, ids=[f"{p}-{f}" for p, _, f in QUERY_TYPES])
def test_wrong_types_in_query_parameters_get_422_naming_the_parameter(app, path, params, field):
    assert_json_error(admin_client(app).get(path, query_string=params), 422, f"query.{field}")


def test_blob_upload_with_an_unknown_encoding_gets_422_and_stores_nothing(client, app, storage):
    data = b"q" * 10
    client.post("/api/v1/versions", json=publish_body({"q": data}))
    assert_json_error(client.put(f"/api/v1/blobs/{sha(data)}?encoding=gzip", data=data), 422, "query.encoding")
    assert_json_error(client.put(f"/api/v1/blobs/{sha(data).upper()}", data=data), 400, "sha256")
    assert count(app, Blob) == 0 and list(storage.iter_keys("v1/")) == []
