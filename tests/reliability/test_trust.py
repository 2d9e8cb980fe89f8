"""Issue 5, item 5: trust. Who may write, and what a reader can and cannot be made to load.

    a read-only fleet client can restore but never publish, and its attempt stores nothing
        -> test_trust_read_only_fleet_client_restores_but_cannot_publish_and_stores_nothing
    a blob that vanished between upload and commit is uploaded again (the commit names it)
        -> test_trust_commit_finding_a_blob_missing_uploads_it_again_and_commits

Covered earlier:
    write and admin scopes on every endpoint, the route table built from the app's url_map (new
    routes fail the test until they declare a scope): tests/service/test_auth.py
        test_the_route_table_covers_every_route_and_matches_what_views_declare
        test_missing_or_wrong_token_is_401_and_a_lower_scope_is_403
    tokens stored hashed: test_revoked_token_is_refused_and_tokens_are_stored_hashed
    bytes that do not match the manifest are never written (a tampered bucket cannot plant a file):
        tests/client/test_publish_restore.py::test_corrupt_blob_is_never_written_and_is_named_in_the_report
"""
from __future__ import annotations

import pytest
from sqlalchemy import func, select

from cachesvc.models import Blob, Version
from cachesvc.storage import INCOMING
from cachesvc_client import CacheClient
from cachesvc_client.transport import blobs
from cachesvc_client.errors import Forbidden
from tests.helpers import ENV
from tests.helpers.restores import NAME, SHAPE, assert_no_half_file, final_files, make_files

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def _count(app, model) -> int:
    with app.extensions["cachesvc"].db.session() as s:
        return s.scalar(select(func.count()).select_from(model))


@pytest.mark.parametrize("storage_settings", ["local"], indirect=True)
def test_trust_read_only_fleet_client_restores_but_cannot_publish_and_stores_nothing(live_server, tokens, tmp_path):
    files = make_files(tmp_path / "builder", {"fxgraph/k/entry": 5000, "sj/k.so": 9000})
    builder = CacheClient(live_server.url, tokens["write"], timeout=10)  # a trusted build job
    assert builder.publish(NAME, SHAPE, env=ENV, roots={"inductor": str(tmp_path / "builder")}).status == "committed"

    fleet = CacheClient(live_server.url, tokens["read"], cache_dir=str(tmp_path / "fleet"), timeout=10)
    assert fleet.restore(NAME, SHAPE, env=ENV).hit
    assert_no_half_file(tmp_path / "fleet", files)

    planted = make_files(tmp_path / "evil", {"fxgraph/k/entry": 5000})  # a fleet machine tries to plant a file
    with pytest.raises(Forbidden):
        fleet.publish(NAME, SHAPE, env=ENV, roots={"inductor": str(tmp_path / "evil")})
    assert _count(live_server.app, Version) == 1 and _count(live_server.app, Blob) == len(files)
    again = CacheClient(live_server.url, tokens["read"], cache_dir=str(tmp_path / "fleet2"), timeout=10)
    assert again.restore(NAME, SHAPE, env=ENV).hit
    assert (tmp_path / "fleet2" / "fxgraph/k/entry").read_bytes() == files["fxgraph/k/entry"]
    assert planted["fxgraph/k/entry"] != files["fxgraph/k/entry"]


@pytest.mark.parametrize("storage_settings", ["s3"], indirect=True)
def test_trust_commit_finding_a_blob_missing_uploads_it_again_and_commits(live_server, tokens, tmp_path, storage,
                                                                          monkeypatch):
    files = make_files(tmp_path / "src", {f"fxgraph/k{i}/entry": 4000 + i for i in range(4)})
    real_upload, lost = blobs.upload, []

    def upload_then_lose_the_first(session, target, headers, **kw):
        real_upload(session, target, headers, **kw)
        if not lost:  # the object vanishes after its upload, before the commit (a concurrent overwrite)
            key = target["url"].split("?")[0].split("/some-prefix/", 1)[1]
            storage.delete(key)
            lost.append(key)

    monkeypatch.setattr(blobs, "upload", upload_then_lose_the_first)
    report = CacheClient(live_server.url, tokens["write"], timeout=10).publish(
        NAME, SHAPE, env=ENV, roots={"inductor": str(tmp_path / "src")})
    assert lost and report.status == "committed"
    # presigned uploads land in the version's incoming folder (v1/incoming/<version>/<key>) and commit moves them
    final = lost[0].split("/", 3)[3] if lost[0].startswith(INCOMING) else lost[0]
    assert storage.stat(final) is not None, "uploaded again"
    restored = CacheClient(live_server.url, tokens["read"], cache_dir=str(tmp_path / "ctr"), timeout=10).restore(
        NAME, SHAPE, env=ENV)
    assert restored.hit and not restored.failed
    assert set(final_files(tmp_path / "ctr")) == set(files)
