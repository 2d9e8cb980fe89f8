"""Helpers shared by test files: no test file imports another, nor a conftest (tests/test_project.py).

This module: small builders shared by the service and client tests (a key, a manifest, a publish
through the API's test client, blobs, a web server that is not cachesvc). The rest, by subject::

    apps.py          a migrated database, a token per scope, an app served over real HTTP (LiveServer)
    backends.py      LOCAL, SQLITE, one_backend: the storage and database fixtures narrowed to one
    service.py       clients with a token, versions aged, sign-in on the pages, the API's operations
    packs.py         packs built and published through the test client
    commands.py      the `cachesvc` command run in this process, and its one-line errors
    client.py        a process made to look like a fresh container, the files a warm process leaves
    restores.py      files published and restored by real clients, a restored cache dir checked whole
    remote_cache.py  fixtures of the client's remote-cache tests, imported by name where they apply

Shared fixtures are in the conftest of the nearest common folder (tests/conftest.py,
tests/service/conftest.py, tests/reliability/conftest.py).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import os
import threading
from typing import Callable, Dict, Iterator, List, Optional

import pytest
import requests
import zstandard

ENV = {"torch": "2.13.0+cpu", "triton": "none", "cuda": "none", "python": "3.11", "device": "x86_64",
       "arch": "avx512"}


def missing_tool(name: str, install: str) -> None:
    """A test needs ``name``, which is not installed: a failure where CI runs the suite (.ci/run installs
    it; tests/conftest.py notes a CI run as TEST_RUN_IN_CI), a skip elsewhere, saying how to get it."""
    if os.environ.get("TEST_RUN_IN_CI"):
        pytest.fail(f"CI must have {name}: .ci/run installs it with apt-get", pytrace=False)
    pytest.skip(f"{name} is not installed here ({install}; .ci/run installs it)")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def key(name: str = "mlp", shape: str = "f32[8,256]", tags: Optional[dict] = None, **env) -> dict:
    return {"name": name, "shape": shape, "tags": tags or {}, "env": {**ENV, **env}}


def manifest(files: Dict[str, bytes], root: str = "inductor") -> List[dict]:
    return [{"root": root, "path": p, "sha256": sha(d), "size": len(d), "mode": 0o644} for p, d in files.items()]


def publish_body(files: Dict[str, bytes], k: Optional[dict] = None, **extra) -> dict:
    return {"key": k or key(), "roots": {"inductor": "/cache/inductor"}, "files": manifest(files), **extra}


def put_blob(client, target: dict, data: bytes):
    """PUT to an upload target: the service's own endpoint (test client) or a presigned S3 URL."""
    if target["url"].startswith("/"):
        return client.put(target["url"], data=data, headers=target.get("headers", {}))
    resp = requests.put(target["url"], data=data, headers=target.get("headers", {}), timeout=30)
    return resp


def zstd_target(client, answer: dict, body: bytes, n: int = 0) -> dict:
    """Where to PUT ``body``, the zstd encoding of the ``n``-th blob a create ``answer`` lists, as the client asks
    for it: a target marked ``needs_size`` (storage presigns each upload for one length) asked again with
    ``body``'s length, presigned for it; any other as the answer gave it."""
    item = answer["upload"][n]
    if not item["targets"]["zstd"].get("needs_size"):
        return item["targets"]["zstd"]
    asked = client.post(f"/api/v1/versions/{answer['version']['id']}/uploads",
                        json={"blobs": [item["sha256"]], "zstd_sizes": {item["sha256"]: len(body)}})
    assert asked.status_code == 200, asked.json
    return asked.json["targets"][0]["targets"]["zstd"]


def get_blob(client, url: str) -> bytes:
    if url.startswith("/"):
        resp = client.get(url)
        try:
            assert resp.status_code == 200, resp.data
            return resp.data
        finally:
            resp.close()
    resp = requests.get(url, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.content


def publish(client, files: Dict[str, bytes], k: Optional[dict] = None, **extra) -> dict:
    """Publish ``files`` (path -> bytes) through the API: create, upload identity, commit. Returns the commit answer.

    ``extra`` goes into the publish body (``kind``, ``meta``)."""
    body = publish_body(files, k, **extra)
    resp = client.post("/api/v1/versions", json=body)
    assert resp.status_code in (200, 201), resp.json
    answer = resp.json
    if answer["status"] == "unchanged":
        return answer
    by_digest = {sha(d): d for d in files.values()}
    for item in answer["upload"]:
        r = put_blob(client, item["targets"]["identity"], by_digest[item["sha256"]])
        assert r.status_code in (200, 201), getattr(r, "json", None)
    resp = client.post(f"/api/v1/versions/{answer['version']['id']}/commit", json={})
    assert resp.status_code == 200, resp.json
    return {**resp.json, "uploaded": [i["sha256"] for i in answer["upload"]]}


def resolve_params(k: dict) -> dict:
    import json

    return {"name": k["name"], "shape": k["shape"], "tags": json.dumps(k["tags"]), **k["env"]}


@functools.lru_cache(maxsize=None)
def _zeros_frame(mib: int) -> bytes:
    """One zstd frame of ``mib`` MiB of zeros (a few KiB), compressed a MiB at a time."""
    co = zstandard.ZstdCompressor(level=1).compressobj()
    chunk = bytes(1 << 20)
    return b"".join([co.compress(chunk) for _ in range(mib)] + [co.flush()])


def zstd_bomb(decoded: int = 4 << 30, frame_mib: int = 128) -> bytes:
    """zstd bytes that decode to ``decoded`` bytes of zeros (a multiple of ``frame_mib`` MiB): frames of
    ``frame_mib`` MiB each, so 4 GiB take about 130 KiB. ``frame_mib=decoded >> 20`` makes one frame."""
    return _zeros_frame(frame_mib) * (decoded // (frame_mib << 20))


@contextlib.contextmanager
def foreign_web_server(body: bytes, status: Callable[[str], int] = lambda path: 404,
                       content_type: str = "text/html") -> Iterator[str]:
    """A web server on loopback that is not cachesvc: every GET and POST gets ``body`` with
    ``status(path)``. Yields its URL."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            self.send_response(status(self.path))
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


# -- tests that compile with Inductor inside the pytest process -------------------------------------------

#: torch's own modules warn as Inductor imports them (torch.jit, pytree); the suite turns warnings into errors
INDUCTOR_IN_PROCESS_MARKS = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
                             pytest.mark.filterwarnings("ignore::FutureWarning"),
                             pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture
def restore_recursion_limit():
    """Inductor's compile_fx raises the recursion limit for good (2000); later tests in this process
    (the service's nesting-depth answers) must see the interpreter's own. Modules that compile in-process
    use it for every test: ``pytestmark = [*INDUCTOR_IN_PROCESS_MARKS, pytest.mark.usefixtures(...)]``."""
    import sys

    limit = sys.getrecursionlimit()
    yield
    sys.setrecursionlimit(limit)


def set_settings(app_or_services, **changes):
    """Give ``app_or_services`` (an app, or its ``Services``) a copy of its settings with ``changes``:
    the settings are frozen, so a test changes the app's copy, never an object others hold."""
    svc = app_or_services.extensions["cachesvc"] if hasattr(app_or_services, "extensions") else app_or_services
    svc.settings = svc.settings.replace(**changes)
    return svc.settings
