"""A stored blob found bad later is healed by the next publish that has it (issue 26, row 8).

The stored object is damaged for real (the file in the local blob folder overwritten; garbage PUT through
rclone's S3), a restore finds it (its bytes fail their sha256) and reports it; the service checks its own
copy and forgets it; the next publish of the same content is told to upload it, and the restore after that
gets the good bytes. A false report (a read token's, about a blob whose bytes are right) changes nothing.
"""
from __future__ import annotations

import os

import pytest
import requests

from cachesvc.models import Blob
from cachesvc.storage import blob_key, pack_key
from tests.helpers.client import client_for, enter_container, write
from tests.helpers import ENV, sha

pytestmark = pytest.mark.parametrize("database_url,storage_settings", [
    ("sqlite", "local"), pytest.param("postgres", "s3", marks=[pytest.mark.postgres, pytest.mark.s3])],
    indirect=True)

NAME, SHAPE = "heal", "f32[4]"
BIG = "cache/sj/csj.main.so"  # past the pack limit: a loose object of its own


def row(server, digest: str):
    with server.app.extensions["cachesvc"].db.session() as s:
        blob = s.get(Blob, digest)
        if blob is not None:
            s.expunge(blob)
        return blob


def damage(server, digest: str, tmp_path) -> None:
    """Overwrite the blob's stored object with garbage of its length, behind the service's back."""
    storage = server.app.extensions["cachesvc"].storage
    blob = row(server, digest)
    key = blob_key(digest, blob.encoding)
    garbage = os.urandom(blob.stored_size)
    path = storage.local_path(key)
    if path is not None:  # the local blob folder
        with open(path, "wb") as f:
            f.write(garbage)
    else:  # a PUT through rclone's S3, as anyone with write access to the bucket can
        (tmp_path / "garbage").write_bytes(garbage)
        storage.put_file(key, str(tmp_path / "garbage"))


def report(server, digest: str, token: str) -> requests.Response:
    return requests.post(f"{server.url}/api/v1/blobs/{digest}/damaged", headers={"Authorization": f"Bearer {token}"},
                         timeout=30)


def test_a_damaged_blob_found_by_a_restore_is_uploaded_again_by_the_next_publish(live_server, tmp_path,
                                                                                  monkeypatch):
    server, tokens = live_server, live_server.app.config["TOKENS"]
    a = enter_container(monkeypatch, tmp_path / "a")
    big = os.urandom(300_000)
    write(a / BIG, big)
    write(a / "cache/sj/csj.main.cpp", b"int main(){}" * 50)
    first = client_for(server.url).publish(NAME, SHAPE, env=ENV)
    assert first.status == "committed"

    # a false report, from a read token, about a blob whose bytes are right: nothing changes
    false = report(server, sha(big), tokens["read"])
    assert false.status_code == 200 and false.json()["status"] == "intact"
    assert row(server, sha(big)) is not None

    damage(server, sha(big), tmp_path)
    b = enter_container(monkeypatch, tmp_path / "b")
    found = client_for(server.url).restore(NAME, SHAPE, env=ENV)
    assert len(found.failed) == 1 and "csj.main.so" in found.failed[0]
    assert not (b / BIG).exists()
    assert row(server, sha(big)) is None  # the restore reported it; the service checked and forgot it
    assert report(server, sha(big), tokens["read"]).json()["status"] == "not_stored"

    enter_container(monkeypatch, tmp_path / "a")
    again = client_for(server.url).publish(NAME, SHAPE, env=ENV)  # the same content as the first publish
    assert again.uploaded_blobs == 1 and again.status in ("committed", "unchanged")
    healed = row(server, sha(big))
    assert healed is not None and healed.size == len(big)

    c = enter_container(monkeypatch, tmp_path / "c")
    good = client_for(server.url).restore(NAME, SHAPE, env=ENV)
    assert good.hit and not good.failed, good
    assert (c / BIG).read_bytes() == big


def test_a_damaged_pack_member_is_forgotten_alone_and_the_next_publish_stores_it_again(live_server, tmp_path,
                                                                                        monkeypatch):
    server = live_server
    a = enter_container(monkeypatch, tmp_path / "a")
    victim, other = b"int victim(){}" * 40, b"int other(){}" * 40  # small: they travel in one pack
    write(a / "cache/sj/victim.cpp", victim)
    write(a / "cache/sj/other.cpp", other)
    assert client_for(server.url).publish(NAME, SHAPE, env=ENV).status == "committed"
    blob = row(server, sha(victim))
    assert blob.pack_digest is not None and row(server, sha(other)).pack_digest == blob.pack_digest
    storage = server.app.extensions["cachesvc"].storage
    key = pack_key(blob.pack_digest)
    with storage.open(key) as body:
        pack = bytearray(body.read())
    pack[blob.pack_offset:blob.pack_offset + blob.stored_size] = b"T" * blob.stored_size  # the member overwritten
    (tmp_path / "pack").write_bytes(bytes(pack))
    storage.put_file(key, str(tmp_path / "pack"))

    b = enter_container(monkeypatch, tmp_path / "b")
    found = client_for(server.url).restore(NAME, SHAPE, env=ENV)
    assert len(found.failed) == 1 and "victim.cpp" in found.failed[0]
    assert (b / "cache/sj/other.cpp").read_bytes() == other
    assert row(server, sha(victim)) is None and row(server, sha(other)) is not None  # only the bad member

    enter_container(monkeypatch, tmp_path / "a")
    assert client_for(server.url).publish(NAME, SHAPE, env=ENV).uploaded_blobs == 1
    c = enter_container(monkeypatch, tmp_path / "c")
    good = client_for(server.url).restore(NAME, SHAPE, env=ENV)
    assert good.hit and not good.failed, good
    assert (c / "cache/sj/victim.cpp").read_bytes() == victim and (c / "cache/sj/other.cpp").read_bytes() == other
