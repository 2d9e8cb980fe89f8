"""What a restore trusts without hashing: a file it placed before, if size, mtime *and* digest still match.

Version ids are one service's numbering. A cache dir outlives a service: a
container pointed at another service, or at the same one with a new
database, meets versions numbered 1, 2, ... again. The stamp once recorded
size and mtime per version id only, so another service's version 2 found
the first one's file of the same size "present" and kept it: a one-call
restart ran a package published for other weights (found in the newcomer
check). Two real services here, each numbering its first
version 1, with same-size files of different content at one path.
"""
from __future__ import annotations

import cachesvc
from tests.helpers.backends import one_backend
from tests.helpers.client import NAME, SHAPE, client_for, enter_container
from tests.helpers.apps import LiveServer, make_tokens, migrated
from tests.helpers import ENV


def second_service(tmp_path):
    app = cachesvc.create_app({"TESTING": True, "DATA_DIR": str(tmp_path / "b-data"),
                               "DATABASE_URL": migrated(f"sqlite:///{tmp_path / 'b.db'}"),
                               "STORAGE_URL": (tmp_path / "b-blobs").as_uri(), "HIT_FLUSH_SECONDS": 0,
                               "TOKEN_CACHE_SECONDS": 0})
    server = LiveServer(app)
    server.start()
    return server, make_tokens(app)["write"]


def publish_one(url, token, root, content: bytes) -> int:
    entry = root / "cache/fxgraph/3a/fkey/entry"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_bytes(content)
    report = client_for(url, token=token).publish(NAME, SHAPE, env=ENV)
    assert report.status == "committed", report
    return report.version_id


@one_backend
def test_another_services_same_numbered_version_replaces_a_same_size_file(live_server, tmp_path, monkeypatch):
    import os

    other, other_token = second_service(tmp_path)
    try:
        a = enter_container(monkeypatch, tmp_path / "pub-a")
        va = publish_one(live_server.url, os.environ["CACHESVC_TOKEN"], a, b"A" * 4096)
        b = enter_container(monkeypatch, tmp_path / "pub-b")
        vb = publish_one(other.url, other_token, b, b"B" * 4096)
        assert va == vb  # the premise: both services number it alike

        r = enter_container(monkeypatch, tmp_path / "restorer")
        placed = r / "cache/fxgraph/3a/fkey/entry"
        first = client_for(live_server.url).restore(NAME, SHAPE, env=ENV)
        assert first.hit and placed.read_bytes() == b"A" * 4096
        again = client_for(live_server.url).restore(NAME, SHAPE, env=ENV)
        assert again.files == 0 and again.files_present >= 1  # the same service's file: trusted, not re-fetched
        switched = client_for(other.url, token=other_token).restore(NAME, SHAPE, env=ENV)
        assert switched.hit and not switched.failed, switched
        assert placed.read_bytes() == b"B" * 4096, "another service's version kept the first one's file"
    finally:
        other.stop()
