"""Packs of small blobs built and published through the API's test client (tests/service/test_packs.py and
the tests that publish packed content)."""
from __future__ import annotations

import zstandard

from tests.helpers import publish_body, put_blob, sha

FILES = {"a.py": b"print('a')\n" * 300, "b.so": bytes(range(256)) * 8, "c.json": b'{"k": 1}'}


def build_pack(files, zstd=("a.py",), tamper=None):
    """(pack bytes, members) of ``files``, ``zstd`` members compressed; ``tamper``: a path whose stored bytes
    are replaced (same length) after its member entry is made."""
    data, members = b"", []
    for path, raw in sorted(files.items()):
        stored = zstandard.ZstdCompressor().compress(raw) if path in zstd else raw
        if path == tamper:
            stored = bytes([stored[0] ^ 0xFF]) + stored[1:]
        members.append({"sha256": sha(raw), "offset": len(data), "stored_size": len(stored),
                        "encoding": "zstd" if path in zstd else "identity", "size": len(raw)})
        data += stored
    return data, members


def start(client, files, k=None):
    resp = client.post("/api/v1/versions", json=publish_body(files, k))
    assert resp.status_code == 201, resp.json
    assert resp.json["packing"]["max_member"] == 256 << 10
    return resp.json


def upload_pack(client, version_id, data):
    resp = client.post(f"/api/v1/versions/{version_id}/packs", json={"packs": [{"sha256": sha(data),
                                                                               "size": len(data)}]})
    assert resp.status_code == 200, resp.json
    r = put_blob(client, resp.json["targets"][0]["target"], data)
    assert r.status_code in (200, 201)


def commit(client, version_id, packs):
    return client.post(f"/api/v1/versions/{version_id}/commit", json={"packs": packs})


def publish_packed(client, files, k=None, **kw):
    answer = start(client, files, k)
    data, members = build_pack({p: d for p, d in files.items()
                                if sha(d) in {u["sha256"] for u in answer["upload"]}}, **kw)
    vid = answer["version"]["id"]
    upload_pack(client, vid, data)
    resp = commit(client, vid, [{"sha256": sha(data), "members": members}])
    return resp, data, members
