"""Blob and pack PUTs through the service (local backend, no presigning) belong to the version's creator
(issue 26, row 8): only the token that created a pending version uploads into it, as only it gets the
version's presigned targets; another write token is a 403 naming the problem, and nothing is written."""
from __future__ import annotations

from cachesvc.models import Blob, Pack
from cachesvc.storage import blob_key, pack_key
from tests.helpers import key, publish_body, sha
from tests.helpers.packs import build_pack

DATA = b"the victim's kernel " * 40


def clients(app, tokens):
    victim, other = app.test_client(), app.test_client()
    victim.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {tokens['write']}"
    other.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {tokens['admin']}"  # any other token, even an admin's
    return victim, other


def refused(resp) -> bool:
    return (resp.status_code == 403 and resp.json["error"]["code"] == "forbidden"
            and "another token" in resp.json["error"]["message"])


def test_only_the_creator_puts_a_blob_into_its_pending_version(app, tokens, storage):
    victim, other = clients(app, tokens)
    answer = victim.post("/api/v1/versions", json=publish_body({"k.py": DATA}, key(name="owned"))).json
    vid = answer["version"]["id"]
    [item] = answer["upload"]
    url = item["targets"]["identity"]["url"]
    assert url.startswith("/api/v1/blobs/"), "through the service"
    for where in (url, f"/api/v1/blobs/{sha(DATA)}?encoding=identity"):  # named, or any pending version
        resp = other.put(where, data=DATA)
        assert refused(resp), (where, resp.json)
    with app.extensions["cachesvc"].db.session() as s:
        assert s.get(Blob, sha(DATA)) is None
    assert storage.stat(blob_key(sha(DATA), "identity")) is None
    assert victim.put(url, data=b"\0" * len(DATA)).status_code == 400  # the creator's PUT is still hash-checked
    assert victim.put(url, data=DATA).status_code == 201
    assert victim.post(f"/api/v1/versions/{vid}/commit", json={}).status_code == 200


def test_only_the_creator_puts_a_pack_into_its_pending_version(app, tokens, storage):
    victim, other = clients(app, tokens)
    files = {"a.py": b"a = 1\n" * 30, "b.py": b"b = 2\n" * 30}
    answer = victim.post("/api/v1/versions", json=publish_body(files, key(name="packed"))).json
    vid = answer["version"]["id"]
    data, members = build_pack(files)
    assert refused(other.post(f"/api/v1/versions/{vid}/packs", json={"packs": [{"sha256": sha(data),
                                                                             "size": len(data)}]}))
    resp = other.put(f"/api/v1/packs/{sha(data)}?version={vid}", data=data)
    assert refused(resp), resp.json
    assert storage.stat(pack_key(sha(data))) is None
    assert victim.put(f"/api/v1/packs/{sha(data)}?version={vid}", data=data[:-1]).status_code == 400
    assert victim.put(f"/api/v1/packs/{sha(data)}?version={vid}", data=data).status_code == 201
    done = victim.post(f"/api/v1/versions/{vid}/commit", json={"packs": [{"sha256": sha(data), "members": members}]})
    assert done.status_code == 200, done.json
    with app.extensions["cachesvc"].db.session() as s:
        assert s.get(Pack, sha(data)) is not None
