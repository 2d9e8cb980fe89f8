"""Tokens and scopes: every endpoint's 401 and 403, anonymous read, /metrics, the token commands."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from sqlalchemy import select

from cachesvc import auth
from cachesvc.models import AuditRecord, Token
from tests.helpers import key, publish, publish_body, resolve_params, set_settings, sha
from tests.helpers.service import with_token

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
              pytest.mark.parametrize("storage_settings", ["local"], indirect=True)]

DIGEST = sha(b"x")
#: every route: (method, path with sample values, scope it needs or None for open)
ROUTES = [
    ("POST", "/api/v1/versions", "write"),
    ("POST", "/api/v1/versions/1/commit", "write"),
    ("GET", "/api/v1/versions/1", "read"),
    ("PUT", f"/api/v1/blobs/{DIGEST}", "write"),
    ("GET", f"/api/v1/blobs/{DIGEST}", "read"),
    ("POST", f"/api/v1/blobs/{DIGEST}/damaged", "read"),
    ("POST", "/api/v1/versions/1/uploads", "write"),
    ("POST", "/api/v1/versions/1/packs", "write"),
    ("PUT", f"/api/v1/packs/{DIGEST}", "write"),
    ("GET", f"/api/v1/packs/{DIGEST}", "read"),
    ("GET", "/api/v1/resolve", "read"),
    ("POST", "/api/v1/verdicts", "read"),  # restoring processes hold read tokens
    ("POST", "/api/v1/usage", "read"),  # and so do the serving processes that report their calls
    ("GET", "/api/v1/demand", "read"),
    ("GET", "/api/v1/entries", "read"),
    ("GET", "/api/v1/entries/1", "read"),
    ("GET", "/api/v1/stats", "read"),
    ("POST", "/api/v1/admin/purge", "admin"),
    ("POST", "/api/v1/admin/gc", "admin"),
    ("GET", "/api/v1/admin/audit", "admin"),
    ("GET", "/api/v1/admin/tokens", "admin"),
    ("POST", "/api/v1/admin/tokens", "admin"),
    ("DELETE", "/api/v1/admin/tokens/999", "admin"),
    ("GET", "/", "read"),
    ("GET", "/entries/1", "read"),
    ("GET", "/stats", "read"),
    ("GET", "/login", None),
    ("POST", "/login", None),
    ("POST", "/logout", None),  # CSRF-checked, as every form on the pages (test_pages_signin.py)
    ("GET", "/admin/purge", "admin"),
    ("POST", "/admin/purge", "admin"),
    ("GET", "/admin/purge/done", "admin"),
    ("GET", "/admin/audit", "admin"),
    ("GET", "/admin/tokens", "admin"),
    ("POST", "/admin/tokens", "admin"),
    ("GET", "/admin/tokens/1/revoke", "admin"),
    ("POST", "/admin/tokens/1/revoke", "admin"),
    ("GET", "/healthz", None),
    ("GET", "/readyz", None),  # the readiness probe: open, as /healthz
    ("GET", "/assets/cachesvc.css", None),  # the pages' stylesheet: the sign-in page needs it too
    ("GET", "/metrics", "read"),  # open unless CACHESVC_METRICS_PUBLIC is off
    ("GET", "/api/v1/openapi.json", None),
    ("GET", "/api/v1/docs", None),  # the browsable API (Swagger UI) and its JS/CSS: the operations keep their scopes
    ("GET", "/api/v1/docs/assets/swagger-ui.css", None),
    ("GET", "/api/v1/docs/init.js", None),  # what starts Swagger UI (no inline script under the CSP)
    ("GET", "/assets/cachesvc.css", None),  # the pages' stylesheet
    ("GET", "/api/v1/remote-cache/fx-graph/pt2:fx-graph-v1::abc:c1", "read"),
    ("PUT", "/api/v1/remote-cache/fx-graph/pt2:fx-graph-v1::abc:c1", "write"),
]
LOWER = {"write": "read", "admin": "write"}


def test_the_route_table_covers_every_route_and_matches_what_views_declare(app):
    with app.test_request_context():
        declared = {}
        for rule in app.url_map.iter_rules():
            if rule.endpoint == "static":
                continue
            for method in rule.methods - {"HEAD", "OPTIONS"}:
                need = auth.required_scope(rule.endpoint)
                declared[(method, rule.rule)] = None if need == "open" else need
    table = {}
    for method, path, scope in ROUTES:
        endpoint = app.url_map.bind("localhost").match(path, method=method)[0]
        table[(method, next(app.url_map.iter_rules(endpoint)).rule)] = scope
    assert table == declared


def anonymous(app):
    return app.test_client()


@pytest.mark.parametrize("method,path,scope", [r for r in ROUTES if r[2]], ids=lambda v: str(v))
def test_missing_or_wrong_token_is_401_and_a_lower_scope_is_403(app, tokens, method, path, scope):
    set_settings(app, ANONYMOUS_READ=False, METRICS_PUBLIC=False)
    body = {"json": {"not": "valid"}}  # authentication comes before body validation
    resp = anonymous(app).open(path, method=method, **body)
    assert resp.status_code == 401 and resp.json["error"]["code"] == "unauthorized"
    for bad in ("cs_not-a-token", tokens[scope][:-1]):
        resp = with_token(app, bad).open(path, method=method, **body)
        assert resp.status_code == 401 and resp.json["error"]["code"] == "unauthorized"
    resp = anonymous(app).open(path, method=method, headers={"Authorization": f"Basic {tokens[scope]}"}, **body)
    assert resp.status_code == 401
    if scope in LOWER:
        resp = with_token(app, tokens[LOWER[scope]]).open(path, method=method, **body)
        assert resp.status_code == 403 and resp.json["error"]["code"] == "forbidden"
        assert f"`{scope}`" in resp.json["error"]["message"]
    for enough in auth.SCOPES[auth.SCOPES.index(scope):]:
        resp = with_token(app, tokens[enough]).open(path, method=method, **body)
        assert resp.status_code not in (401, 403), (enough, resp.json)


#: what is wrong with a request besides its token: a query that is not UTF-8 (from a browser: a page's 401 is
#: its sign-in form), a body that is not JSON, a body of a type no route reads; and the path's variables
#: (``bad_path``) values no view takes
BAD_INPUT = {"query": {"environ_overrides": {"QUERY_STRING": "tags=%7B&a=\xff"}, "headers": {"Accept": "text/html"}},
             "json": {"data": b"{not json", "content_type": "application/json"},
             "type": {"data": b"\x00", "content_type": "text/plain"}}


def bad_path(rule) -> str:
    """``rule`` with every variable a value its view refuses: a string no digest, name or key is, id 0."""
    return re.sub(r"<(?:(\w+):)?\w+>", lambda m: "0" if m.group(1) == "int" else "not%20a%20digest", rule.rule)


@pytest.mark.parametrize("anonymous_read", [False, True], ids=["anonymous-read-off", "anonymous-read-on"])
def test_every_route_authenticates_before_it_checks_the_request(app, tokens, anonymous_read):
    """Issue 37: an unauthenticated `POST /api/v1/blobs/x/damaged` answered 400 (anonymous read let the request
    in; the digest check answered), and a query that was not UTF-8 got a 400 before the 401 on every route.
    Every route of the app's URL map, with bad input of every kind and no token: 401, unless anonymous read
    is on and lets an anonymous request read there; with a token of too low a scope: 403."""
    set_settings(app, ANONYMOUS_READ=anonymous_read, METRICS_PUBLIC=False)
    checked = set()
    with app.test_request_context():
        routes = [(rule, method, auth.required_scope(rule.endpoint), app.view_functions[rule.endpoint])
                  for rule in app.url_map.iter_rules() for method in sorted(rule.methods - {"HEAD", "OPTIONS"})]
    for rule, method, need, view in routes:
        if need == "open":
            continue
        let_in = anonymous_read and need == "read" and getattr(view, "_cachesvc_anonymous", True)
        for what, bad in BAD_INPUT.items():
            if not let_in:
                resp = anonymous(app).open(bad_path(rule), method=method, **bad)
                assert resp.status_code == 401, (method, rule.rule, what, resp.status_code, resp.data[:200])
            if need in LOWER:
                resp = with_token(app, tokens[LOWER[need]]).open(bad_path(rule), method=method, **bad)
                assert resp.status_code == 403, (method, rule.rule, what, resp.status_code, resp.data[:200])
        checked.add((method, rule.rule, let_in))
    assert ("POST", "/api/v1/blobs/<sha256>/damaged", False) in checked, "a damage report needs a token, always"
    assert len(checked) > 30


def test_anonymous_read_setting(app, tokens):
    publish(with_token(app, tokens["write"]), {"a": b"1"})
    svc = app.extensions["cachesvc"]
    set_settings(svc, ANONYMOUS_READ=True)
    anon = anonymous(app)
    assert anon.get("/api/v1/resolve", query_string=resolve_params(key())).json["hit"] is True
    assert anon.get("/").status_code == 200
    assert anon.post("/api/v1/versions", json=publish_body({"b": b"2"})).status_code == 401, "never anonymous write"
    assert anon.post("/api/v1/admin/gc").status_code == 401
    set_settings(svc, ANONYMOUS_READ=False)
    assert anon.get("/api/v1/entries").status_code == 401
    assert with_token(app, tokens["read"]).get("/api/v1/entries").json["total"] == 1


def test_anonymous_read_is_on_for_the_embedded_default_only(app):
    from cachesvc import config

    assert config.load({"DATABASE_URL": "sqlite:////tmp/x.db"}, environ={}).ANONYMOUS_READ is True
    assert config.load({"DATABASE_URL": "postgresql+psycopg://u@h/db"}, environ={}).ANONYMOUS_READ is False
    assert config.load({}, environ={"CACHESVC_ANONYMOUS_READ": "0"}).ANONYMOUS_READ is False


def test_healthz_open_and_metrics_open_unless_closed(app, tokens):
    svc = app.extensions["cachesvc"]
    set_settings(svc, ANONYMOUS_READ=False)
    anon = anonymous(app)
    assert anon.get("/healthz").status_code == 200
    assert anon.get("/metrics").status_code == 200
    set_settings(svc, METRICS_PUBLIC=False)
    set_settings(svc, ANONYMOUS_READ=True)  # anonymous read does not open closed metrics
    assert anon.get("/metrics").status_code == 401
    resp = with_token(app, tokens["read"]).get("/metrics")
    assert resp.status_code == 200 and b"cachesvc_http_requests_total" in resp.data
    # Prometheus' own type, charset once (issue 37: "text/plain; version=1.0.0; charset=utf-8; charset=utf-8")
    assert resp.headers["Content-Type"] == "text/plain; version=1.0.0; charset=utf-8"


def test_revoked_token_is_refused_and_tokens_are_stored_hashed(app, tokens):
    admin = with_token(app, tokens["admin"])
    made = admin.post("/api/v1/admin/tokens", json={"name": "ci-builder", "scope": "write"})
    assert made.status_code == 201
    token = made.json["token"]
    assert token.startswith("cs_") and len(token) >= 40
    body = publish_body({"a": b"1"})
    assert with_token(app, token).post("/api/v1/versions", json=body).status_code == 201
    with app.extensions["cachesvc"].db.session() as s:
        row = s.scalars(select(Token).where(Token.name == "ci-builder")).one()
        assert row.token_hash == auth.hash_token(token) and token not in row.token_hash
    listed = admin.get("/api/v1/admin/tokens").json["tokens"]
    assert all("token" not in t and "token_hash" not in t for t in listed)
    assert admin.delete("/api/v1/admin/tokens/ci-builder").json["revoked"][0]["name"] == "ci-builder"
    resp = with_token(app, token).post("/api/v1/versions", json=body)
    assert resp.status_code == 401
    assert admin.delete("/api/v1/admin/tokens/ci-builder").status_code == 404
    actions = [r["action"] for r in admin.get("/api/v1/admin/audit").json["records"]]
    assert actions[:2] == ["token.revoke", "token.create"]


def test_publish_is_audited_with_who_and_bytes(app, tokens):
    publish(with_token(app, tokens["write"]), {"a": b"12345", "b": b"678"})
    rec = with_token(app, tokens["admin"]).get("/api/v1/admin/audit", query_string={"action": "publish"}).json
    [r] = rec["records"]
    assert r["actor"] == "token:test-write" and r["bytes"] == 8 and r["details"]["files"] == 2
    assert r["details"]["new_stored_bytes"] == 8 and r["at"]
    with app.extensions["cachesvc"].db.session() as s:
        assert s.scalar(select(AuditRecord.action)) == "publish"


def cachesvc_cli(tmp_path, *args, db=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHESVC_")}
    env["CACHESVC_DATA_DIR"] = str(tmp_path / "cli-data")
    if db:
        env["CACHESVC_DATABASE_URL"] = db
    return subprocess.run([sys.executable, "-m", "cachesvc.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_token_commands_create_print_last_line_and_revoke(app, sqlite_url, tmp_path):
    made = cachesvc_cli(tmp_path, "token", "create", "--scope", "write", "--name", "ci-builder", db=sqlite_url)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    assert token.startswith("cs_") and " " not in token
    assert with_token(app, token).post("/api/v1/versions", json=publish_body({"a": b"1"})).status_code == 201
    listed = cachesvc_cli(tmp_path, "token", "list", db=sqlite_url)
    assert "ci-builder" in listed.stdout and token not in listed.stdout
    gone = cachesvc_cli(tmp_path, "token", "revoke", "ci-builder", db=sqlite_url)
    assert gone.returncode == 0 and "revoked" in gone.stdout
    assert with_token(app, token).post("/api/v1/versions", json=publish_body({"a": b"1"})).status_code == 401
    again = cachesvc_cli(tmp_path, "token", "revoke", "ci-builder", db=sqlite_url)
    assert again.returncode != 0 and "no active token" in again.stderr
    bad = cachesvc_cli(tmp_path, "token", "create", "--scope", "root", "--name", "x", db=sqlite_url)
    assert bad.returncode == 2
