"""Issue 15, item 11: a publish of a manifest at the file limit completes with the client's default timeouts.

The service's limit is lowered to 20,000 files (the default CACHESVC_MAX_FILES is 100,000: bench/probes/publish_scale.py
measures that on PostgreSQL + S3, docs/benchmarks.md); the publish holds exactly that many, tiny ones (packed)
and two large ones (uploaded loose, their targets asked for in batches of one).
"""
from __future__ import annotations

import json
import os

import pytest

from cachesvc_client import CacheClient
from cachesvc_client.publish import snapshot as publish_mod
from cachesvc_client.transport import ServiceAPI
from tests.helpers import ENV, publish_body, set_settings, sha

pytestmark = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
              pytest.mark.parametrize("storage_settings", ["local"], indirect=True)]

LIMIT = 20_000


def test_a_publish_at_the_file_limit_completes_with_default_timeouts(live_server, tmp_path, monkeypatch):
    set_settings(live_server.app, MAX_FILES=LIMIT)
    src = tmp_path / "cache"
    for i in range(LIMIT - 2):
        d = src / f"d{i // 500:03d}"
        if i % 500 == 0:
            d.mkdir(parents=True)
        (d / f"f{i:05d}").write_bytes(i.to_bytes(4, "big") * 8)
    for name in ("big-a.so", "big-b.so"):
        (src / name).write_bytes(os.urandom(300_000))
    answers = []
    real_call = ServiceAPI.call

    def call(self, method, path, *a, **kw):
        out = real_call(self, method, path, *a, **kw)
        answers.append((path, out))
        return out

    monkeypatch.setattr(ServiceAPI, "call", call)
    monkeypatch.setattr(publish_mod, "TARGET_BATCH", 1)
    client = CacheClient(live_server.url, cache_dir=str(src))  # the default timeouts
    report = client.publish("big", "f32[1]", env=ENV, roots={"inductor": str(src)}, merge=False)
    assert report.status == "committed" and report.files == LIMIT, report
    created = next(out for path, out in answers if path == "/api/v1/versions")
    assert len(created["upload"]) == LIMIT and all(set(i) == {"sha256", "size"} for i in created["upload"])
    assert len(json.dumps(created)) < 100 * LIMIT, "the create answer grows by more than ~90 bytes a blob"
    batches = [out for path, out in answers if path.endswith("/uploads")]
    assert len(batches) == 2 and all(len(b) == 1 for b in batches)  # sha256 -> targets, one a batch
    version = client.api.call("GET", f"/api/v1/versions/{report.version_id}")
    assert version["state"] == "committed" and version["file_count"] == LIMIT


def test_upload_targets_are_only_for_the_versions_own_blobs(client):
    body = publish_body({"a": b"a" * 10, "b": b"b" * 10}, inline_targets=False)
    created = client.post("/api/v1/versions", json=body).json
    assert all("targets" not in i for i in created["upload"])
    vid = created["version"]["id"]
    got = client.post(f"/api/v1/versions/{vid}/uploads", json={"blobs": [sha(b"a" * 10)]}).json
    assert [t["sha256"] for t in got["targets"]] == [sha(b"a" * 10)] and got["stored"] == []
    assert set(got["targets"][0]["targets"]) == {"identity", "zstd"}
    other = client.post(f"/api/v1/versions/{vid}/uploads", json={"blobs": [sha(b"c")]})
    assert other.status_code == 400 and "not a file of" in other.json["error"]["message"], other.json
    assert client.post(f"/api/v1/versions/{vid}/uploads", json={"blobs": []}).status_code == 422
