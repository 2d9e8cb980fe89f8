"""Issue 29, item 3: readiness (``/readyz``) asks the blob storage too, bounded; liveness stays cheap.

Real parts: a `cachesvc serve` process on its own rclone S3 server, killed; a blob folder gone; an S3
endpoint that accepts connections and never answers (a hung store).
"""
from __future__ import annotations

import shutil
import socket
import threading

import requests

from cachesvc.api.health import StorageCheck
from cachesvc.storage.s3 import S3Storage


def _failed(resp) -> list:
    assert resp.status_code == 503, (resp.status_code, resp.text)
    error = resp.json()["error"] if callable(resp.json) else resp.json["error"]
    assert error["code"] == "unavailable" and "storage" in error["message"], error
    return error["details"]["failed"]


def test_readiness_fails_naming_the_storage_when_s3_is_killed_and_liveness_stays_up(own_s3, start_service):
    svc = start_service(env=own_s3.service_env(own_s3.new_bucket()))
    assert requests.get(f"{svc.url}/readyz", timeout=10).json()["status"] == "ok"

    own_s3.stop(crash=True)
    assert _failed(requests.get(f"{svc.url}/readyz", timeout=10)) == ["storage"]
    live = requests.get(f"{svc.url}/healthz", timeout=10)
    assert live.status_code == 200 and live.json()["status"] == "ok"  # no storage call: no restart for it

    own_s3.start()
    assert requests.get(f"{svc.url}/readyz", timeout=10).status_code == 200


def test_readiness_fails_naming_the_storage_when_the_blob_folder_is_gone(app):
    client = app.test_client()
    assert client.get("/readyz").status_code == 200
    root = app.extensions["cachesvc"].storage.root
    shutil.rmtree(root)  # a volume that is not mounted (root reads any folder, so not a chmod)
    assert _failed(client.get("/readyz")) == ["storage"]
    assert client.get("/healthz").status_code == 200
    root.mkdir()
    assert client.get("/readyz").status_code == 200


class _Silent:
    """A TCP port that takes connections (the kernel's backlog) and never answers: a hung S3."""

    def __enter__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        return self

    def __exit__(self, *exc):
        self.sock.close()


def _hung_storage(url: str) -> S3Storage:
    return S3Storage("bucket", "prefix", endpoint_url=url, access_key="k", secret_key="s")


def test_a_hung_store_is_not_ready_within_the_deadline_with_one_check_in_flight():
    with _Silent() as silent:
        check = StorageCheck(_hung_storage(silent.url))
        # a deadline under the check's own 2 s read timeout: only the deadline can end these waits
        first = check.problem(deadline=0.3)
        assert first.startswith("storage did not answer within 0.3 s"), first
        pending = check._pending
        assert not pending.done()
        assert check.problem(deadline=0.3).startswith("storage did not answer")
        assert check._pending is pending  # the second probe waited on the first check, started none
        checks = [t for t in threading.enumerate() if t.name == "cachesvc-storage-check"]
        assert len(checks) == 1, checks
        assert pending.exception(timeout=30) is not None  # the check itself ends, on its read timeout


def test_readiness_answers_503_naming_the_storage_when_s3_hangs(tmp_path, database_url):
    import cachesvc

    with _Silent() as silent:
        app = cachesvc.create_app({"TESTING": True, "DATA_DIR": str(tmp_path / "data"), "DATABASE_URL": database_url,
                                   "STORAGE_URL": "s3://bucket/prefix", "S3_ENDPOINT_URL": silent.url,
                                   "S3_ACCESS_KEY_ID": "k", "S3_SECRET_ACCESS_KEY": "s"})
        try:
            assert _failed(app.test_client().get("/readyz")) == ["storage"]
            assert app.test_client().get("/healthz").status_code == 200
        finally:
            app.extensions["cachesvc"].db.engine.dispose()
