"""Hostile values in every field of every form of the pages (issue 26, row 6): never a 500.

The API is fuzzed from its OpenAPI document (test_fuzz_api.py); the pages' forms are in no document,
so this sends each form, signed in as admin with its CSRF token, with each hostile value in each
field in turn (the other fields valid), as urlencoded bytes: what a browser or a script can send.
"""
from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.helpers import publish
from tests.helpers.service import HTML, csrf_of, sign_in

pytestmark = pytest.mark.parametrize("storage_settings", ["local"], indirect=True)

#: raw (already percent-encoded) values: a 5000-digit number (int() refuses past 4,300 digits), one past
#: every id, signs, exponents, NUL, a lone surrogate and a bare 0xff in UTF-8, long text, empties
HOSTILE = ["5" * 5000, "9" * 40, "2147483648", "-1", "0", "+1", "1e9", "1.5", " 1 ", "%00", "%ED%A0%80", "%FF",
           "x" * 5000, "", "%20", "%5B%5D", "%E2%80%AE", "%C2%B9", "%D9%A3"]  # superscript one, Arabic three

#: (method, path, the form's fields with valid values)
FORMS = [
    ("POST", "/admin/purge", {"version": "1"}),
    ("POST", "/admin/purge", {"entry": "1"}),
    ("GET", "/admin/purge", {"version": "1"}),
    ("GET", "/admin/purge", {"entry": "1"}),
    ("POST", "/admin/tokens", {"name": "fleet", "scope": "read"}),
    ("GET", "/admin/audit", {"action": "publish", "offset": "0"}),
    ("GET", "/", {"name": "mlp", "shape": "s", "torch": "2", "tag": "a=b", "q": "m", "kind": "inductor",
                  "sort": "newest", "offset": "0", "problem": "1"}),
    ("GET", "/stats", {"days": "30"}),
    ("POST", "/login", {"token": "x", "next": "/"}),
]


@pytest.mark.parametrize("database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
                         indirect=True)
def test_every_field_of_every_form_takes_every_hostile_value_without_a_500(app, client, tokens):
    publish(client, {"a.bin": b"a"})
    people = app.test_client()
    sign_in(people, tokens["admin"])
    csrf = csrf_of(people.get("/admin/tokens", headers=HTML).get_data(as_text=True))
    seen = []
    for method, path, fields in FORMS:
        for field in fields:
            for value in HOSTILE:
                raw = "&".join(f"{k}={value if k == field else quote(v)}" for k, v in fields.items())
                if method == "GET":
                    resp = people.get(f"{path}?{raw}", headers=HTML)
                else:
                    resp = people.post(path, data=f"{raw}&csrf_token={csrf}", headers=HTML,
                                       content_type="application/x-www-form-urlencoded")
                seen.append((method, path, field, value[:12], resp.status_code))
                if path == "/login":
                    sign_in(people, tokens["admin"])  # a sign-in attempt ends the admin's session
                    csrf = csrf_of(people.get("/admin/tokens", headers=HTML).get_data(as_text=True))
    assert [s for s in seen if s[-1] >= 500] == []
    assert ("POST", "/admin/purge", "version", "5" * 12, 400) in seen
    for digits in (str(2**31), "5" * 5000):  # the revoke form's id is in its path
        assert people.post(f"/admin/tokens/{digits}/revoke", data={"csrf_token": csrf}, headers=HTML).status_code < 500
