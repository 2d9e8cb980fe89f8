"""Bad input gets a 4xx with the JSON error body, the same on SQLite and PostgreSQL (issue 15, item 7).

One test per class that was a 500 (or a 503 that clients retry): lone surrogates in JSON text, JSON
nested past the recursion limit in a query parameter, integers past every bound, a query string that
is not UTF-8, and paths that PostgreSQL's btree could not index. tests/service/test_fuzz_api.py
generates the same classes at every operation; these pin each one down by name.
"""
from __future__ import annotations

import random

import pytest
from sqlalchemy import func, select
from werkzeug.test import EnvironBuilder, run_wsgi_app

from cachesvc.models import Entry, Token, Version
from cachesvc_client.shared import keys
from tests.helpers import key, publish, publish_body, resolve_params

pytestmark = [pytest.mark.backends("database"),  # what each database refuses (index sizes, NUL, ranges): a 4xx
              pytest.mark.parametrize("storage_settings", ["local"], indirect=True)]  # storage plays no part


def count(app, model) -> int:
    with app.extensions["cachesvc"].db.session() as s:
        return s.scalar(select(func.count()).select_from(model))


def as_admin(app):
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {app.config['TOKENS']['admin']}"
    return c


def assert_json_error(resp, status, *words):
    assert resp.status_code == status, (resp.status_code, resp.get_data(as_text=True)[:300])
    assert resp.is_json and set(resp.json) == {"error"}, resp.get_data(as_text=True)[:300]
    for word in words:
        assert word in resp.json["error"]["message"], (word, resp.json["error"]["message"])


SURROGATE = "x\ud800y"


def _with_key(**changes):
    k = key()
    k.update({f: v for f, v in changes.items() if f in ("name", "shape")})
    k["tags"].update(changes.get("tags", {}))
    k["env"].update(changes.get("env", {}))
    return publish_body({"f": b"1"}, k)


PUBLISH_BODIES = {
    "path": publish_body({"ok/a" + SURROGATE: b"1"}),
    "meta value": publish_body({"f": b"1"}, kind="mega-cache", meta={"note": SURROGATE}),
    "meta key": publish_body({"f": b"1"}, meta={SURROGATE: "v"}),
    "root folder": {**publish_body({"f": b"1"}), "roots": {"inductor": "/cache/" + SURROGATE}},
    "name": _with_key(name=SURROGATE),
    "shape": _with_key(shape=SURROGATE),
    "tag value": _with_key(tags={"mode": SURROGATE}),
    "env": _with_key(env={"torch": SURROGATE}),
}


@pytest.mark.parametrize("field", PUBLISH_BODIES)
def test_a_lone_surrogate_anywhere_in_a_publish_is_a_422_naming_it_and_stores_nothing(client, app, field):
    resp = client.post("/api/v1/versions", json=PUBLISH_BODIES[field])
    assert_json_error(resp, 422, "invalid request")
    assert "surrogate" in resp.json["error"]["message"] or "control characters" in resp.json["error"]["message"]
    assert count(app, Version) == 0 and count(app, Entry) == 0


def test_a_lone_surrogate_in_purge_criteria_token_names_and_verdict_text_is_a_422(app):
    admin = as_admin(app)
    for criterion in ("name", "torch_version", "device"):
        resp = admin.post("/api/v1/admin/purge", json={criterion: SURROGATE, "dry_run": True})
        assert_json_error(resp, 422, f"json.{criterion}", "lone surrogate")
    assert_json_error(admin.post("/api/v1/admin/tokens", json={"name": SURROGATE, "scope": "read"}), 422,
                      "json.name", "lone surrogate")
    assert count(app, Token) == 3  # the fixture's three
    assert_json_error(admin.post("/api/v1/verdicts", json={"versions": [1], "verdict": SURROGATE}), 422,
                      "json.verdict")


def test_an_entry_page_shows_unicode_meta_and_a_surrogate_meta_never_gets_stored(client, app):
    # One lone surrogate in a version's meta made its entry page a 500 for good (the page renders
    # the meta of non-inductor-dir kinds); now the publish is refused, and valid unicode shows.
    done = publish(client, {"blob": b"mega"}, kind="mega-cache", meta={"note": "snowman \u2603 \U0001f600"})
    entry_id = done["version"]["entry_id"]
    page = client.get(f"/entries/{entry_id}")
    assert page.status_code == 200 and "snowman \u2603 \U0001f600" in page.get_data(as_text=True)
    refused = client.post("/api/v1/versions", json=publish_body({"blob": b"mega2"}, kind="mega-cache",
                                                                 meta={"note": SURROGATE}))
    assert_json_error(refused, 422, "json.meta.note.value", "lone surrogate")
    assert client.get(f"/entries/{entry_id}").status_code == 200
    assert client.get(f"/api/v1/entries/{entry_id}").status_code == 200


DEEP = "[" * 1000


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # anonymous read: SQLite's default
def test_tags_nested_past_the_recursion_limit_is_a_400_anonymous_too(app):
    anonymous = app.test_client()
    for depth in (DEEP, '{"a":' * 1000, "[" * 100_000):
        resp = anonymous.get("/api/v1/resolve", query_string={**resolve_params(key()), "tags": depth})
        assert_json_error(resp, 400, "tags must be a JSON object", "nested too deeply")
        assert_json_error(anonymous.get("/api/v1/entries", query_string={"tags": depth}), 400,
                          "tags must be a JSON object", "nested too deeply")


def test_tags_nested_too_deeply_is_a_400_on_every_database(client):
    assert_json_error(client.get("/api/v1/resolve", query_string={**resolve_params(key()), "tags": DEEP}), 400,
                      "nested too deeply")
    assert_json_error(client.get("/api/v1/entries", query_string={"tags": DEEP}), 400, "nested too deeply")


@pytest.mark.parametrize("offset", [str(2**63), str(10**30), "9" * 5000])
def test_a_huge_offset_is_a_4xx_on_the_html_index_and_the_api(app, offset):
    # SQLite's OFFSET takes 64 bits: int(offset) went to the driver and raised OverflowError (a 500).
    admin = as_admin(app)
    assert_json_error(admin.get("/", query_string={"offset": offset}), 400, "offset")
    assert_json_error(admin.get("/api/v1/entries", query_string={"offset": offset}), 422, "query.offset")
    assert_json_error(admin.get("/api/v1/admin/audit", query_string={"offset": offset}), 422, "query.offset")
    assert admin.get("/", query_string={"offset": "1000000000"}).status_code == 200  # the bound itself


def test_an_integer_of_more_digits_than_python_reads_is_a_400(client):
    # json.loads raises ValueError past 4,300 digits (not JSONDecodeError, which webargs maps).
    body = '{"blobs": [%s]}' % ("1" * 5000)  # within the route's body limit (a verdict's is smaller)
    assert_json_error(client.post("/api/v1/versions/1/uploads", data=body, content_type="application/json"), 400,
                      "JSON body cannot be read", "4300 digits")


def test_a_query_string_that_is_not_utf8_is_a_400_everywhere(app):
    for path in ("/api/v1/entries", "/api/v1/resolve", "/", "/stats"):
        environ = EnvironBuilder(path=path, headers={"Authorization": f"Bearer {app.config['TOKENS']['read']}"})
        environ = environ.get_environ()
        environ["QUERY_STRING"] = "name=a\xff"  # the raw byte 0xff, as a WSGI server passes it (latin-1)
        body, status, headers = run_wsgi_app(app, environ, buffered=True)
        assert status.startswith("400"), (path, status)
        assert b"not valid UTF-8" in b"".join(body), path


def _incompressible(chars: int, rnd: random.Random, low: int, high: int) -> str:
    return "".join(chr(rnd.randint(low, high)) for _ in range(chars))


def _path_of_bytes(extra: int = 0) -> str:
    """A path of exactly MAX_PATH_BYTES (+ ``extra``) UTF-8 bytes of random CJK (3 bytes a character),
    which no compression shrinks below PostgreSQL's btree row limit."""
    rnd = random.Random(7)
    parts = [_incompressible(80, rnd, 0x4E00, 0x9FFF) for _ in range(8)] + [_incompressible(40, rnd, 0x4E00, 0x9FFF)]
    path = "/".join(parts) + "a" * extra
    assert len(path.encode("utf-8")) == keys.MAX_PATH_BYTES + extra
    return path


def test_the_longest_path_commits_and_resolves_and_one_byte_more_is_a_422_on_every_database(client, app):
    # On PostgreSQL a valid 1,024-character path of 3- or 4-byte characters overflowed the index row
    # of version_files (2,704 bytes): a 503 that clients retried for 30 s. The limit is in bytes now.
    longest = _path_of_bytes()
    done = publish(client, {longest: b"deep"})
    assert done["status"] == "committed"
    answer = client.get("/api/v1/resolve", query_string=resolve_params(key())).json
    assert [f["path"] for f in answer["files"]] == [longest]
    assert_json_error(client.post("/api/v1/versions", json=publish_body({_path_of_bytes(1): b"x"}, key(name="n2"))),
                      422, "2049 bytes long in UTF-8; the limit is 2048")
    emoji = "/".join(["\U0001f600" * 63] * 16)[:keys.MAX_PATH - 1] + "a"  # 1,024 characters, 4,048 bytes
    assert_json_error(client.post("/api/v1/versions", json=publish_body({emoji: b"x"}, key(name="n3"))), 422,
                      "bytes long in UTF-8")
    assert count(app, Version) == 1
