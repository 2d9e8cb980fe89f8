"""Presigned uploads count only once what was uploaded is the blob (issue 26, row 8), on the real rclone
S3 server: commit checked only the size of blobs under 8 MiB, so a same-size object of garbage at the
target (another write token's, or a broken uploader's) claimed the digest, and the victim's restore
left the file out for good."""
from __future__ import annotations

import pytest
import zstandard

from cachesvc.storage import blob_key
from tests.helpers import key, publish_body, put_blob, sha, zstd_target

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


def test_every_presigned_target_takes_its_signed_length_only(client, app, storage):
    """Issue 26, row 9 and issue 37: presigned PUT URLs pinned no size (ten 20 MiB PUTs to the targets of 64-byte
    blobs were taken, and after the identity target signed its length the zstd one still took 5 of 10). Every
    presigned target now signs its body's length: the identity one the blob's size, the zstd one the length the
    client states once it has compressed (until then the zstd target is the service's own, which reads and
    refuses what is not the blob). What a sender left in the version's incoming folder goes at commit."""
    data = b"k" * 64
    packed = zstandard.ZstdCompressor().compress(data)
    answer = client.post("/api/v1/versions", json=publish_body({"k.py": data}, key(name="sized"))).json
    vid = answer["version"]["id"]
    [item] = answer["upload"]
    big = b"\0" * (20 << 20)
    assert put_blob(client, item["targets"]["identity"], big).status_code == 403  # S3 checks the signed length
    unsized = item["targets"]["zstd"]
    assert unsized["url"].startswith("/api/v1/blobs/") and unsized["needs_size"], unsized
    assert put_blob(client, unsized, big).status_code == 400  # the service reads it: not the blob
    sized = zstd_target(client, answer, packed)
    assert not sized["url"].startswith("/") and "needs_size" not in sized
    assert [put_blob(client, sized, big).status_code for _ in range(10)] == [403] * 10
    assert put_blob(client, sized, packed + b"\0").status_code == 403
    uploads = f"/api/v1/versions/{vid}/uploads"
    for wrong, said in (({sha(data): 64}, "only when it is smaller"), ({sha(b"other"): 10}, "which blobs does not")):
        refused = client.post(uploads, json={"blobs": [sha(data)], "zstd_sizes": wrong})
        assert refused.status_code == 400 and said in refused.json["error"]["message"], refused.json
    assert put_blob(client, item["targets"]["identity"], b"\1" * 64).status_code == 200  # a wrong blob, right length
    assert put_blob(client, sized, packed).status_code == 200
    assert client.post(f"/api/v1/versions/{vid}/commit", json={}).status_code == 200
    assert list(storage.iter_keys(f"v1/incoming/{vid}/")) == [], "the commit swept what it did not take"
    with storage.open(blob_key(sha(data), "zstd")) as body:
        assert body.read() == packed


def test_only_the_token_that_created_a_version_gets_its_targets_and_commits_it(app, tokens, storage):
    """Another write token fetched a pending version's upload targets and overwrote an upload in flight,
    which the creator's commit then promoted (issue 26, row 8)."""
    victim, other = app.test_client(), app.test_client()
    victim.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {tokens['write']}"
    other.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {tokens['admin']}"  # any other token, even an admin's
    data = b"v" * 100
    answer = victim.post("/api/v1/versions", json=publish_body({"v.py": data}, key(name="owned"),
                                                               inline_targets=False)).json
    vid = answer["version"]["id"]
    for path, body in ((f"/api/v1/versions/{vid}/uploads", {"blobs": [sha(data)]}),
                       (f"/api/v1/versions/{vid}/packs", {"packs": [{"sha256": sha(data), "size": 1}]}),
                       (f"/api/v1/versions/{vid}/commit", {})):
        refused = other.post(path, json=body)
        assert refused.status_code == 403 and "another token" in refused.json["error"]["message"], path
    [item] = victim.post(f"/api/v1/versions/{vid}/uploads", json={"blobs": [sha(data)]}).json["targets"]
    assert put_blob(victim, item["targets"]["identity"], data).status_code == 200
    assert victim.post(f"/api/v1/versions/{vid}/commit", json={}).status_code == 200
