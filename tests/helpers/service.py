"""The service tests' clients and pages: a client with a token, versions aged, what storage holds, sign-in
on the pages, and every operation the API documents.
"""
from __future__ import annotations

import datetime as dt
import re

from sqlalchemy import update

from cachesvc.models import Version, utcnow

HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}  # what chromium sends


def admin(app):
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {app.config['TOKENS']['admin']}"
    return c


def with_token(app, token):
    c = app.test_client()
    c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return c


def age(app, version_id, created_days, restored_days=None):
    now = utcnow()
    values = {"created_at": now - dt.timedelta(days=created_days)}
    if restored_days is not None:
        values["last_restored_at"] = now - dt.timedelta(days=restored_days)
    with app.extensions["cachesvc"].db.session() as s:
        s.execute(update(Version).where(Version.id == version_id).values(**values))


def keys_in(storage):
    return set(storage.iter_keys("v1/"))


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def sign_in(c, token: str, next_path: str = "/"):
    form = c.get("/login", headers=HTML).get_data(as_text=True)
    return c.post("/login", data={"token": token, "next": next_path, "csrf_token": csrf_of(form)}, headers=HTML)


#: Every operation in the document; test_every_documented_operation_is_fuzzed keeps this list honest.
OPERATIONS = [
    "GET /healthz",
    "GET /readyz",
    "GET /metrics",
    "POST /api/v1/versions",
    "GET /api/v1/versions/{version_id}",
    "POST /api/v1/versions/{version_id}/commit",
    "PUT /api/v1/blobs/{sha256}",
    "GET /api/v1/blobs/{sha256}",
    "POST /api/v1/blobs/{sha256}/damaged",
    "POST /api/v1/versions/{version_id}/packs",
    "POST /api/v1/versions/{version_id}/uploads",
    "PUT /api/v1/packs/{sha256}",
    "GET /api/v1/packs/{sha256}",
    "GET /api/v1/resolve",
    "POST /api/v1/verdicts",
    "POST /api/v1/usage",
    "GET /api/v1/demand",
    "GET /api/v1/entries",
    "GET /api/v1/entries/{entry_id}",
    "GET /api/v1/stats",
    "POST /api/v1/admin/purge",
    "POST /api/v1/admin/gc",
    "GET /api/v1/admin/audit",
    "GET /api/v1/admin/tokens",
    "POST /api/v1/admin/tokens",
    "DELETE /api/v1/admin/tokens/{ident}",
    "GET /api/v1/remote-cache/{cache}/{key}",
    "PUT /api/v1/remote-cache/{cache}/{key}",
]
