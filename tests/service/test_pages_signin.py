"""Sign-in on the pages (Flask's test client): the session cookie, CSRF, revocation, HTML against JSON errors,
and the admin pages (purge preview and confirmation, audit log, tokens). The browser runs are test_browser.py."""
from __future__ import annotations

import re

import pytest

from sqlalchemy import select, update

from cachesvc.lifecycle import actions
from cachesvc.models import PageSession, Token
from tests.helpers import key, publish, resolve_params, set_settings
from tests.helpers.service import HTML, csrf_of, sign_in

pytestmark = pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@pytest.fixture
def people(app):
    """A client with no token, on a service where anonymous read is off (the PostgreSQL default)."""
    set_settings(app, ANONYMOUS_READ=False)
    return app.test_client()


def session_of(app, resp) -> dict:
    """The session a response's cookie holds (signed, not encrypted: readable, not forgeable)."""
    value = resp.headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
    return app.session_interface.get_signing_serializer(app).loads(value)


def test_browsers_get_the_sign_in_page_and_json_clients_json(people):
    page = people.get("/entries/1", headers=HTML)
    assert page.status_code == 401 and page.mimetype == "text/html"
    html = page.get_data(as_text=True)
    assert 'id="login"' in html and 'name="next" value="/entries/1"' in html
    assert people.get("/").json["error"]["code"] == "unauthorized", "no Accept: text/html, so JSON"
    api = people.get("/api/v1/entries", headers=HTML)
    assert api.status_code == 401 and api.json["error"]["code"] == "unauthorized", "the API stays JSON"


@SQLITE
def test_sign_in_sets_a_hardened_session_cookie_that_only_the_pages_honour(people, tokens, client):
    publish(client, {"a.py": b"a"}, key(name="resnet"))
    done = sign_in(people, tokens["read"], "/?name=resnet")
    assert done.status_code == 303 and done.headers["Location"] == "/?name=resnet"
    cookie = done.headers["Set-Cookie"]
    assert cookie.startswith("cachesvc_session=") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert "Secure" not in cookie and "Expires=" in cookie, "plain http: not Secure; expires (SESSION_HOURS)"
    assert tokens["read"] not in cookie and set(session_of(people.application, done)) == {"signed_in", "_permanent"}
    page = people.get("/?name=resnet", headers=HTML).get_data(as_text=True)
    assert page.count('<tr class="entry">') == 1 and "test-read" in page and "Sign out" in page
    assert people.get("/api/v1/entries").status_code == 401, "the cookie authenticates no API request"

    secure = people.application.test_client()
    form = secure.get("/login", base_url="https://cache.example").get_data(as_text=True)
    over_https = secure.post("/login", base_url="https://cache.example", headers={"Referer": "https://cache.example/login"},
                             data={"token": tokens["read"], "next": "/", "csrf_token": csrf_of(form)})
    assert over_https.status_code == 303 and "Secure" in over_https.headers["Set-Cookie"]


@SQLITE
def test_a_wrong_token_or_a_foreign_next_signs_nobody_in_and_sends_nowhere(people, tokens):
    wrong = sign_in(people, "cs_" + "x" * 43)
    assert wrong.status_code == 401 and "Unknown or revoked token" in wrong.get_data(as_text=True)
    assert people.get("/", headers=HTML).status_code == 401
    for foreign in ("//evil.example/x", "https://evil.example/", "javascript:alert(1)"):
        assert sign_in(people, tokens["read"], foreign).headers["Location"] == "/"


@SQLITE
def test_posts_without_the_csrf_token_are_refused_and_change_nothing(people, tokens, client, app):
    vid = publish(client, {"a.py": b"a"}, key())["version"]["id"]
    assert people.post("/login", data={"token": tokens["admin"], "next": "/"}).status_code == 400
    assert people.get("/", headers=HTML).status_code == 401, "no session from a login without its CSRF token"
    sign_in(people, tokens["admin"])
    refused = people.post("/admin/purge", data={"version": str(vid)}, headers=HTML)
    assert refused.status_code == 400 and "reload the page" in refused.get_data(as_text=True)
    forged = people.post("/admin/purge", data={"version": str(vid), "csrf_token": "not-the-token"})
    assert forged.status_code == 400 and forged.json["error"]["code"] == "bad_request"
    assert people.post("/admin/tokens", data={"name": "sneaky", "scope": "admin"}).status_code == 400
    assert people.post("/logout").status_code == 400
    assert client.get("/api/v1/resolve", query_string=resolve_params(key())).json["hit"], "still there"
    assert [t["name"] for t in actions.list_tokens(app.extensions["cachesvc"])["tokens"]] == [
        "test-read", "test-write", "test-admin"]


def test_a_revoked_token_signs_its_session_out_at_the_next_request(people, tokens, app):
    sign_in(people, tokens["read"])
    assert people.get("/", headers=HTML).status_code == 200
    actions.revoke_token(app.extensions["cachesvc"], "test-read", actor="test")  # another process, say the CLI
    gone = people.get("/", headers=HTML)
    assert gone.status_code == 401 and "was revoked" in gone.get_data(as_text=True)
    assert "signed_in" not in session_of(app, gone), "the session is cleared (a CSRF token for the form is left)"
    sign_in(people, tokens["write"])
    page = people.get("/", headers=HTML)
    assert page.status_code == 200
    out = people.post("/logout", data={"csrf_token": csrf_of(page.get_data(as_text=True))})
    assert out.status_code == 303 and people.get("/", headers=HTML).status_code == 401


@SQLITE
def test_page_errors_are_html_for_browsers_and_json_otherwise(client):
    missing = client.get("/entries/99999", headers=HTML)
    assert missing.status_code == 404 and missing.mimetype == "text/html"
    assert "entry 99999 does not exist" in missing.get_data(as_text=True)
    assert client.get("/entries/99999").json["error"] == {"code": "not_found", "message": "entry 99999 does not exist"}
    bad = client.get("/", query_string={"sort": "nope"}, headers=HTML)
    assert bad.status_code == 400 and "sort must be one of" in bad.get_data(as_text=True)
    assert client.get("/api/v1/entries/99999", headers=HTML).json["error"]["code"] == "not_found"
    forbidden = client.get("/admin/audit", headers=HTML)  # the write token
    assert forbidden.status_code == 403 and "this needs <code>admin</code>" in forbidden.get_data(as_text=True)
    assert "`" not in forbidden.get_data(as_text=True), "the error's Markdown code spans are rendered, not shown"


@SQLITE
def test_read_tokens_see_no_admin_control_and_get_403_on_admin_pages(people, tokens, client):
    entry_id = publish(client, {"a.py": b"a"}, key())["version"]["entry_id"]
    sign_in(people, tokens["read"])
    html = people.get(f"/entries/{entry_id}", headers=HTML).get_data(as_text=True)
    assert "Purge" not in html and "/admin/" not in html
    for path in ("/admin/purge?entry=1", "/admin/audit", "/admin/tokens"):
        refused = people.get(path, headers=HTML)
        assert refused.status_code == 403
        assert re.search(r'signed in as <strong id="me">test-read</strong> \(read\)', refused.get_data(as_text=True))


@SQLITE
def test_admin_purges_a_version_from_its_page_after_a_dry_run_preview(people, tokens, client, app):
    k = key(name="resnet")
    old = publish(client, {"a.py": b"a" * 700, "shared.bin": b"s" * 300}, k)["version"]
    new = publish(client, {"b.py": b"b" * 500, "shared.bin": b"s" * 300}, k)["version"]
    sign_in(people, tokens["admin"])
    entry = people.get(f"/entries/{new['entry_id']}", headers=HTML).get_data(as_text=True)
    assert f"Purge version {new['id']}" in entry and "Purge this entry" in entry

    preview = people.get("/admin/purge", query_string={"version": new["id"]}, headers=HTML)
    html = preview.get_data(as_text=True)
    assert preview.status_code == 200 and "A dry run" in html
    assert "<strong>1</strong>" in html and "<strong>500 B</strong>" in html, "only b.py goes: shared.bin stays"
    assert client.get("/api/v1/resolve", query_string=resolve_params(k)).json["version"]["id"] == new["id"]

    posted = people.post("/admin/purge", data={"version": str(new["id"]), "csrf_token": csrf_of(html)}, headers=HTML)
    assert posted.status_code == 303 and posted.headers["Location"].endswith("/admin/purge/done"), "post-redirect-get"
    done = people.get("/admin/purge/done", headers=HTML)
    assert done.status_code == 200 and "1 version purged" in done.get_data(as_text=True)
    refreshed = people.get("/admin/purge/done", headers=HTML)
    assert refreshed.status_code == 303, "a refresh shows the outcome no second time and purges nothing"
    assert client.get("/api/v1/resolve", query_string=resolve_params(k)).json["version"]["id"] == old["id"]
    records = people.get("/admin/audit", query_string={"action": "purge"}, headers=HTML).get_data(as_text=True)
    assert records.count('<tr class="record">') == 1 and "token:test-admin" in records
    assert f"version_id={new['id']}" in records
    after = people.get(f"/entries/{new['entry_id']}", headers=HTML).get_data(as_text=True)
    assert re.search(rf"<td>{new['id']} <strong>purged</strong>", after)
    assert "+1 purged" in people.get("/", headers=HTML).get_data(as_text=True)
    assert people.get("/admin/audit", query_string={"action": "nope"}, headers=HTML).status_code == 400
    nothing = people.get("/admin/purge", query_string={"version": new["id"]}, headers=HTML).get_data(as_text=True)
    assert 'id="nothing"' in nothing and 'id="confirm"' not in nothing
    assert people.get("/admin/purge", query_string={"version": "x"}, headers=HTML).status_code == 400
    assert people.get("/admin/purge", headers=HTML).status_code == 400


@SQLITE
def test_admin_creates_a_token_seen_once_and_revokes_it(people, tokens, app):
    sign_in(people, tokens["admin"])
    page = people.get("/admin/tokens", headers=HTML).get_data(as_text=True)
    posted = people.post("/admin/tokens", data={"name": "fleet", "scope": "read", "csrf_token": csrf_of(page)},
                         headers=HTML)
    assert posted.status_code == 303 and posted.headers["Location"].endswith("/admin/tokens"), "post-redirect-get"
    made = people.get("/admin/tokens", headers=HTML)
    assert made.status_code == 200 and made.headers["Cache-Control"] == "no-store"
    secret = re.search(r'id="secret">(cs_[^<]+)<', made.get_data(as_text=True)).group(1)
    assert [t["name"] for t in actions.list_tokens(app.extensions["cachesvc"])["tokens"]].count("fleet") == 1
    fleet = app.test_client()
    assert fleet.get("/api/v1/entries", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    listing = people.get("/admin/tokens", headers=HTML).get_data(as_text=True)
    assert "fleet" in listing and secret not in listing, "shown once"
    bad = people.post("/admin/tokens", data={"name": "", "scope": "root", "csrf_token": csrf_of(listing)}, headers=HTML)
    assert bad.status_code == 400 and "invalid token" in bad.get_data(as_text=True)
    twice = people.post("/admin/tokens", data={"name": "fleet", "scope": "read", "csrf_token": csrf_of(listing)},
                        headers=HTML)
    assert twice.status_code == 400 and "already active" in twice.get_data(as_text=True)
    fleet_id = next(t["id"] for t in actions.list_tokens(app.extensions["cachesvc"])["tokens"] if t["name"] == "fleet")
    assert f'href="/admin/tokens/{fleet_id}/revoke"' in listing, "Revoke opens a confirmation first"
    ask = people.get(f"/admin/tokens/{fleet_id}/revoke", headers=HTML)
    assert ask.status_code == 200 and 'id="confirm-revoke"' in ask.get_data(as_text=True)
    assert fleet.get("/api/v1/entries", headers={"Authorization": f"Bearer {secret}"}).status_code == 200, \
        "asking changed nothing"
    gone = people.post(f"/admin/tokens/{fleet_id}/revoke", data={"csrf_token": csrf_of(ask.get_data(as_text=True))})
    assert gone.status_code == 303
    assert people.get(f"/admin/tokens/{fleet_id}/revoke", headers=HTML).status_code == 404, "revoked already"
    assert fleet.get("/api/v1/entries", headers={"Authorization": f"Bearer {secret}"}).status_code == 401
    audit = people.get("/admin/audit", headers=HTML).get_data(as_text=True)
    assert "token.create" in audit and "token.revoke" in audit


@SQLITE
def test_a_new_token_waits_on_the_server_never_in_the_cookie_and_shows_once(people, tokens, app):
    """Issue 27 item 10: the session cookie is signed, not encrypted; the token created on the page travels to
    the page the redirect opens in the sign-in's row, which that page empties, and in no cookie."""
    import json

    sign_in(people, tokens["admin"])
    page = people.get("/admin/tokens", headers=HTML).get_data(as_text=True)
    posted = people.post("/admin/tokens", data={"name": "fleet", "scope": "read", "csrf_token": csrf_of(page)},
                         headers=HTML)
    assert posted.status_code == 303
    shown = people.get("/admin/tokens", headers=HTML)
    secret = re.search(r'id="secret">(cs_[^<]+)<', shown.get_data(as_text=True)).group(1)
    for resp in (posted, shown):
        for cookie in resp.headers.getlist("Set-Cookie"):
            assert secret not in cookie and secret not in json.dumps(session_of(app, resp)), cookie
    with app.extensions["cachesvc"].db.session() as s:
        assert s.scalars(select(PageSession.flash)).all() == [None], "kept in the sign-in's row, emptied as shown"
    again = people.get("/admin/tokens", headers=HTML).get_data(as_text=True)
    assert "fleet" in again and secret not in again, "a refresh does not show it twice"


@SQLITE
def test_replicas_with_one_secret_key_honour_each_others_sign_ins_and_others_do_not(app, tokens, tmp_path,
                                                                                     database_url, storage_settings):
    import cachesvc

    made = []

    def replica(**settings):
        other = cachesvc.create_app({"TESTING": True, "DATA_DIR": str(tmp_path / "data"), "DATABASE_URL": database_url,
                                     "ANONYMOUS_READ": False, "TOKEN_CACHE_SECONDS": 0, **storage_settings, **settings})
        made.append(other)
        return other.test_client()

    first, second = replica(SECRET_KEY="one key for all"), replica(SECRET_KEY="one key for all")
    assert sign_in(first, tokens["read"]).status_code == 303
    cookie = first.get_cookie("cachesvc_session")
    for c, status in ((second, 200), (replica(), 401), (replica(SECRET_KEY="another key"), 401)):
        c.set_cookie("cachesvc_session", cookie.value)
        assert c.get("/", headers=HTML).status_code == status
    for other in made:
        other.extensions["cachesvc"].db.engine.dispose()


@pytest.mark.parametrize("database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
                         indirect=True)
def test_sign_out_ends_the_session_on_the_server_so_a_copied_cookie_opens_nothing(people, tokens, app):
    """Issue 26, row 5: sign-out cleared only the browser's cookie; a copy still opened the admin pages
    and created an admin token for up to SESSION_HOURS."""
    sign_in(people, tokens["admin"])
    cookie = people.get_cookie("cachesvc_session").value
    thief = app.test_client()
    thief.set_cookie("cachesvc_session", cookie)
    assert thief.get("/admin/tokens", headers=HTML).status_code == 200, "the copy works while signed in"
    csrf = csrf_of(thief.get("/admin/tokens", headers=HTML).get_data(as_text=True))
    page = people.get("/admin/tokens", headers=HTML).get_data(as_text=True)
    assert people.post("/logout", data={"csrf_token": csrf_of(page)}).status_code == 303
    stolen = app.test_client()
    stolen.set_cookie("cachesvc_session", cookie)  # the cookie as it was before the sign-out
    assert stolen.get("/admin/tokens", headers=HTML).status_code == 401
    made = stolen.post("/admin/tokens", data={"name": "backdoor", "scope": "admin", "csrf_token": csrf}, headers=HTML)
    assert made.status_code in (400, 401)
    with app.extensions["cachesvc"].db.session() as s:
        assert "backdoor" not in {t.name for t in s.scalars(select(Token))}
        assert s.scalars(select(PageSession)).all() == []


def test_a_session_past_its_hours_ends_on_the_server_whatever_the_cookie_says(people, tokens, app):
    sign_in(people, tokens["read"])
    with app.extensions["cachesvc"].db.session() as s:
        s.execute(update(PageSession).values(expires_at=PageSession.created_at))
    assert people.get("/", headers=HTML).status_code == 401
