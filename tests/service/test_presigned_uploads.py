"""Presigned uploads count only once what was uploaded is the blob (issue 26, row 8), on the real rclone
S3 server: commit checked only the size of blobs under 8 MiB, so a same-size object of garbage at the
target (another write token's, or a broken uploader's) claimed the digest, and the victim's restore
left the file out for good."""
from __future__ import annotations

import pytest

from cachesvc.storage import blob_key
from tests.helpers import key, publish_body, put_blob, sha

pytestmark = [pytest.mark.s3, pytest.mark.parametrize("storage_settings", ["s3"], indirect=True),
              pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


def test_a_same_size_garbage_upload_is_refused_at_commit_and_the_real_one_then_counts(client, app, storage):
    data = b"the compiled kernel " * 50
    answer = client.post("/api/v1/versions", json=publish_body({"k.py": data}, key(name="victim"))).json
    vid = answer["version"]["id"]
    [item] = answer["upload"]
    target = item["targets"]["identity"]
    assert not target["url"].startswith("/"), "presigned: the bytes go straight to S3"
    assert put_blob(client, target, b"\0" * len(data)).status_code == 200  # S3 takes any bytes
    refused = client.post(f"/api/v1/versions/{vid}/commit", json={"uploaded": [{"sha256": sha(data),
                                                                               "encoding": "identity"}]})
    assert refused.status_code == 409 and refused.json["error"]["code"] == "blobs_missing", refused.json
    assert put_blob(client, target, data).status_code == 200
    done = client.post(f"/api/v1/versions/{vid}/commit", json={})
    assert done.status_code == 200, done.json
    with storage.open(blob_key(sha(data), "identity")) as body:
        assert body.read() == data
