"""Issue 15, item 1, with real processes: a decompression bomb costs a `cachesvc serve` worker a 4xx,
never its memory.

One gunicorn worker (so every request lands on it) on SQLite + a local blob folder and on
PostgreSQL + rclone S3; each route that decodes gets a bomb of 4 GiB (about 130 KiB of zstd): the
blob PUT, a pack member at commit, the S3 read-back of a large presigned upload at commit, and a
remote-cache read of an object replaced in storage. The worker's peak resident set (VmHWM, read
from /proc) may grow by ``GROWTH`` at most over the same requests with good bytes; an unbounded
decode would add 4 GiB.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

import pytest
import requests

from cachesvc.content import blobs
from cachesvc.storage import blob_key, from_url
from tests.helpers import ENV, key, sha, zstd_bomb

GROWTH = 160 << 20
BOMB = 4 << 30
RC_URL = "/api/v1/remote-cache/fx-graph/pt2:fx-graph-v1::bomb:c1"


def children(pid: int) -> List[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def peak_rss(pid: int) -> int:
    """The largest VmHWM among ``pid``'s child processes (the gunicorn workers), in bytes."""
    peaks = []
    for child in children(pid):
        for line in Path(f"/proc/{child}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peaks.append(int(line.split()[1]) * 1024)
    assert peaks, "no worker process found"
    return max(peaks)


class Api:
    def __init__(self, svc):
        self.url, self.token, self.session = svc.url, svc.token, requests.Session()

    def call(self, method: str, path: str, **kw) -> requests.Response:
        """A request to the service (with the token), or to a presigned URL (without: S3 refuses it)."""
        if path.startswith("http"):
            return self.session.request(method, path, timeout=120, **kw)
        return self.session.request(method, self.url + path, timeout=120,
                                    headers={"Authorization": f"Bearer {self.token}"}, **kw)

    def pending(self, name: str, files: dict) -> dict:
        body = {"key": key(name=name), "roots": {"inductor": "/cache/inductor"},
                "files": [{"root": "inductor", "path": p, "sha256": d, "size": n, "mode": 0o644}
                          for p, (d, n) in files.items()]}
        resp = self.call("POST", "/api/v1/versions", json=body)
        assert resp.status_code == 201, resp.text
        return resp.json()


def hit_every_decoding_route(api: Api, storage, tmp_path: Path, bomb: bytes, round_: str) -> List[int]:
    """One request per decoding route with ``bomb`` as the stored bytes; returns their statuses."""
    statuses = []
    data = f"blob {round_} ".encode() * 50_000
    v = api.pending(f"put-{round_}", {"b.so": (sha(data), len(data))})
    statuses.append(api.call("PUT", f"/api/v1/blobs/{sha(data)}?encoding=zstd&version={v['version']['id']}",
                             data=bomb).status_code)

    small = f"member {round_}".encode() * 40
    v = api.pending(f"pack-{round_}", {"m.py": (sha(small), len(small))})
    vid = v["version"]["id"]
    target = api.call("POST", f"/api/v1/versions/{vid}/packs",
                      json={"packs": [{"sha256": sha(bomb), "size": len(bomb)}]}).json()["targets"][0]["target"]
    assert api.call("PUT", target["url"], data=bomb).status_code in (200, 201)
    member = {"sha256": sha(small), "offset": 0, "stored_size": len(bomb), "encoding": "zstd", "size": len(small)}
    statuses.append(api.call("POST", f"/api/v1/versions/{vid}/commit",
                             json={"packs": [{"sha256": sha(bomb), "members": [member]}]}).status_code)

    size = blobs.VERIFY_AT_COMMIT_MIN + 1
    digest = sha(round_.encode() * size)
    v = api.pending(f"readback-{round_}", {"h.gch": (digest, size)})
    if v["upload"][0]["targets"]["zstd"].get("needs_size"):  # presigned (S3): straight to the bucket, read back at commit
        zstd_target = api.call("POST", f"/api/v1/versions/{v['version']['id']}/uploads", json={
            "blobs": [digest], "zstd_sizes": {digest: len(bomb)}}).json()["targets"][0]["targets"]["zstd"]
        assert api.call("PUT", zstd_target["url"], data=bomb).status_code == 200
        statuses.append(api.call("POST", f"/api/v1/versions/{v['version']['id']}/commit",
                                 json={"uploaded": [{"sha256": digest, "encoding": "zstd"}]}).status_code)

    value = f"value {round_}".encode() * 100
    assert api.call("PUT", RC_URL, params=ENV, data=value).status_code == 201
    replaced = tmp_path / f"replaced-{round_}"
    replaced.write_bytes(bomb)
    storage.put_file(blob_key(sha(value), "zstd"), str(replaced))
    statuses.append(api.call("GET", RC_URL, params=ENV).status_code)
    return statuses


@pytest.mark.parametrize("setup", ["sqlite-local", pytest.param("postgres-s3", marks=[pytest.mark.postgres,
                                                                                       pytest.mark.s3])])
def test_bombs_cost_a_worker_a_4xx_and_no_memory(setup, start_service, tmp_path, request):
    if setup == "postgres-s3":
        s3 = request.getfixturevalue("s3_server")
        bucket = s3.new_bucket()
        env = {"CACHESVC_DATABASE_URL": request.getfixturevalue("postgres_url"), **s3.service_env(bucket)}
        storage = from_url(s3.settings(bucket, "cachesvc")["STORAGE_URL"], s3.settings(bucket, "cachesvc"))
    else:
        env, storage = {}, from_url((tmp_path / "svc" / "blobs").as_uri())
    svc = start_service("svc", env, workers=1)
    api = Api(svc)

    # the same requests with harmless bytes first: the worker's imports, pools and buffers settle
    harmless = zstd_bomb(128 << 20, frame_mib=128)[:100]  # a cut frame: refused at once, nothing decoded
    hit_every_decoding_route(api, storage, tmp_path, harmless, "warm")
    before = peak_rss(svc.proc.pid)

    statuses = hit_every_decoding_route(api, storage, tmp_path, zstd_bomb(BOMB), "bomb")
    after = peak_rss(svc.proc.pid)
    expected = [400, 400, 409, 404] if setup == "postgres-s3" else [400, 400, 404]
    assert statuses == expected
    assert after - before < GROWTH, f"the worker's peak RSS grew by {(after - before) >> 20} MiB"
    assert svc.proc.poll() is None and api.call("GET", "/healthz").status_code == 200
