"""Bodies are bounded per route before anything parses them (issue 26, rows 1 and 2).

A 63 MiB sign-in form grew a worker by 3.1 GB (the CSRF check parsed it) and 64 MiB of ``[{},...]``
to /api/v1/verdicts by 1.7 GB: pages, forms and JSON now take ``BODY_LIMIT_BYTES`` (64 KiB) unless
the route declares its own, the JSON routes a limit worked out from the largest request their
schema allows. The streams here fail the test if the service reads them: a declared length past the
limit is refused from the headers alone.
"""
from __future__ import annotations

import io
import json

import pytest

from cachesvc.api import verdicts, versions
from tests.helpers.service import HTML

pytestmark = [pytest.mark.parametrize("storage_settings", ["local"], indirect=True),
              pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]

FORM = "application/x-www-form-urlencoded"


class _Stream(io.RawIOBase):
    """A body of ``length`` bytes as the test client measures it (by seeking), without holding them."""

    length, pos = 0, 0

    def readable(self):
        return True

    def seek(self, offset, whence=0):
        self.pos = (0, self.pos, self.length)[whence] + offset
        return self.pos


class Unread(_Stream):
    """A body that must not be read: every read is recorded (and answers bytes, as a client would)."""

    def __init__(self, length: int):
        self.reads, self.length = 0, length

    def readinto(self, buf):
        self.reads += 1
        n = min(len(buf), self.length - self.pos)
        buf[:n] = b"a" * n
        self.pos += n
        return n


class Endless(_Stream):
    """A chunked body that never ends; counts what the service read of it."""

    def __init__(self, fill: bytes = b"token=" + b"a" * 1000):
        self.read_bytes, self.fill = 0, fill

    def readinto(self, buf):
        n = len(buf)
        buf[:n] = (self.fill * (n // len(self.fill) + 1))[:n]
        self.read_bytes += n
        return n


@pytest.mark.parametrize("method, path, ctype", [("POST", "/login", FORM), ("POST", "/logout", FORM),
                                                 ("POST", "/admin/purge", FORM), ("POST", "/admin/tokens", FORM),
                                                 ("POST", "/api/v1/verdicts", "application/json"),
                                                 ("POST", "/api/v1/admin/purge", "application/json")])
def test_a_63_mib_body_to_a_page_form_or_json_route_is_413_with_nothing_read(app, tokens, method, path, ctype):
    body = Unread(63 << 20)
    resp = app.test_client().open(path, method=method, input_stream=body,
                                  content_type=ctype, headers={**HTML, "Authorization": f"Bearer {tokens['admin']}"})
    assert resp.status_code == 413, resp.data[:300]
    assert body.reads == 0
    assert "BODY_LIMIT_BYTES" in resp.get_data(as_text=True) or path == "/api/v1/verdicts"


def test_a_chunked_form_is_read_only_up_to_the_limit(app):
    body = Endless()
    resp = app.test_client().post("/login", input_stream=body, content_type=FORM,
                                  headers={**HTML, "Transfer-Encoding": "chunked"},
                                  environ_overrides={"wsgi.input_terminated": True})  # what gunicorn says of chunked
    assert resp.status_code == 413
    assert body.read_bytes <= app.extensions["cachesvc"].settings.BODY_LIMIT_BYTES + (1 << 16)


@pytest.mark.parametrize("path, largest", [("/api/v1/verdicts", verdicts.LARGEST),
                                           ("/api/v1/versions/1/uploads", versions.LARGEST_UPLOAD_TARGETS),
                                           ("/api/v1/versions/1/packs", versions.LARGEST_PACK_TARGETS)])
def test_json_routes_take_their_largest_valid_request_and_refuse_past_their_limit(app, client, path, largest):
    """The limit is the route's own: the largest request the schema allows (indented) is read and
    answered (404: no such version), a body of junk past the limit is 413 before it is parsed."""
    valid = json.dumps(largest, indent=2).encode()
    resp = client.post(path, data=valid, content_type="application/json")
    assert resp.status_code == 404, resp.json
    limit = app.view_functions[{"/api/v1/verdicts": "verdicts.post", "/api/v1/versions/1/uploads":
                                "versions.blob_targets", "/api/v1/versions/1/packs": "versions.pack_targets"}[path]
                               ]._cachesvc_body_limit
    junk = b"[" + b"{}," * (limit // 3) + b"{}]"
    body = Unread(len(junk))
    assert client.post(path, data=junk, content_type="application/json").status_code == 413
    assert client.post(path, input_stream=body, content_type="application/json").status_code == 413
    assert body.reads == 0


def test_the_verdict_limit_is_kibibytes_not_the_64_mib_of_a_manifest(app):
    assert app.view_functions["verdicts.post"]._cachesvc_body_limit < 16 << 10
