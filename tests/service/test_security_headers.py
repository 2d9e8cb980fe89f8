"""Every answer forbids framing and sniffing and carries a strict CSP (issue 26, row 4): a same-site page
could frame "Yes, purge" or "Revoke" with an admin's Lax cookie. test_browser.py and
test_api_docs_browser.py check in chromium that the pages and Swagger UI work under the CSP."""
from __future__ import annotations

import pytest
from tests.helpers.service import HTML, sign_in


pytestmark = [pytest.mark.parametrize("storage_settings", ["local"], indirect=True),
              pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]

PATHS = ["/", "/stats", "/login", "/admin/tokens", "/admin/audit", "/api/v1/docs", "/api/v1/openapi.json",
         "/api/v1/entries", "/api/v1/stats", "/healthz", "/metrics", "/no/such/page", "/api/v1/docs/init.js",
         "/assets/cachesvc.css"]


def test_every_page_api_answer_and_error_forbids_framing_and_inline_code(app, tokens):
    people = app.test_client()
    sign_in(people, tokens["admin"])
    for path in PATHS:
        resp = people.get(path, headers=HTML)
        assert resp.status_code in (200, 404), (path, resp.status_code)
        assert resp.headers["X-Frame-Options"] == "DENY", path
        assert resp.headers["X-Content-Type-Options"] == "nosniff", path
        csp = dict(d.strip().split(" ", 1) for d in resp.headers["Content-Security-Policy"].split(";"))
        assert csp["frame-ancestors"] == "'none'" and csp["default-src"] == "'self'", path
        assert csp["script-src"] == "'self'" and csp["style-src"] == "'self'", path
        if resp.mimetype == "text/html":
            html = resp.get_data(as_text=True)
            assert "<style" not in html and "style=" not in html, path
            assert "<script>" not in html.replace(" ", ""), path  # every script has a src
        resp.close()


def test_a_refused_request_carries_them_too(app):
    resp = app.test_client().post("/login", data=b"x" * (100 << 10), content_type="application/x-www-form-urlencoded")
    assert resp.status_code == 413 and resp.headers["X-Frame-Options"] == "DENY"
