"""Issue 15, item 10: the local backend follows no symbolic link in the blob folder.

Someone who can write to the folder (but not to the service) replaces a blob, a pack or a
folder by a link to a file of the host's: it reads as a missing object on every path (the
storage calls, GET /api/v1/blobs, GET /api/v1/packs with and without Range, the remote
cache), is never written through, and GC's sweep of ``.incoming`` deletes nothing it points to.
"""
from __future__ import annotations

import os

import pytest

from cachesvc.storage import BlobNotFound, StorageError, blob_key, pack_key
from tests.helpers import ENV, publish, sha
from tests.helpers.packs import FILES, publish_packed

pytestmark = pytest.mark.parametrize("storage_settings", ["local"], indirect=True)

SECRET = b"root:x:0:0:root:/root:/bin/bash\n"  # what /etc/passwd looks like; ours lies in tmp_path


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "outside" / "passwd"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def link_in_place_of(storage, key: str, target) -> None:
    path = storage.root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


def test_a_linked_object_or_folder_reads_as_missing_and_is_never_written_through(storage, secret, tmp_path):
    link_in_place_of(storage, "v1/blobs/aa/linked", secret)
    with pytest.raises(BlobNotFound):
        storage.open("v1/blobs/aa/linked")
    with pytest.raises(BlobNotFound):
        storage.read_range("v1/blobs/aa/linked", 0, 4)
    assert storage.stat("v1/blobs/aa/linked") is None

    (storage.root / "v1/blobs").mkdir(parents=True, exist_ok=True)
    os.symlink(secret.parent, storage.root / "v1/blobs/bb")  # a whole folder replaced by a link
    with pytest.raises(BlobNotFound):
        storage.open("v1/blobs/bb/passwd")
    assert storage.stat("v1/blobs/bb/passwd") is None
    upload = tmp_path / "upload"
    upload.write_bytes(b"planted")
    with pytest.raises(StorageError):
        storage.put_file("v1/blobs/bb/planted", str(upload))
    assert not (secret.parent / "planted").exists()
    storage.delete("v1/blobs/bb/passwd")  # through the linked folder: nothing
    storage.delete("v1/blobs/aa/linked")  # the link itself goes, never what it points to
    assert secret.read_bytes() == SECRET and not (storage.root / "v1/blobs/aa/linked").is_symlink()


def test_a_blob_or_pack_replaced_by_a_link_is_not_served(client, storage, secret):
    publish(client, {"graph.py": b"print('hi')\n" * 10})
    digest = sha(b"print('hi')\n" * 10)
    link_in_place_of(storage, blob_key(digest, "identity"), secret)
    resp = client.get(f"/api/v1/blobs/{digest}")
    assert resp.status_code == 404 and SECRET not in resp.data, resp.data

    _, data, _ = publish_packed(client, {k: v + b"#2" for k, v in FILES.items()})
    link_in_place_of(storage, pack_key(sha(data)), secret)
    for headers in ({}, {"Range": "bytes=0-9"}):
        resp = client.get(f"/api/v1/packs/{sha(data)}", headers=headers)
        assert resp.status_code == 404 and SECRET not in resp.data, (headers, resp.data)


def test_a_remote_cache_object_replaced_by_a_link_is_a_miss(client, storage, secret):
    url = "/api/v1/remote-cache/fx-graph/pt2:fx-graph-v1::linked:c1"
    assert client.put(url, query_string=ENV, data=b"a value").status_code == 201
    link_in_place_of(storage, blob_key(sha(b"a value"), "zstd"), secret)
    resp = client.get(url, query_string=ENV)
    assert resp.status_code == 404 and SECRET not in resp.data
    assert client.put(url, query_string=ENV, data=b"a value").status_code == 201  # stored again, the link replaced
    assert client.get(url, query_string=ENV).data == b"a value" and secret.read_bytes() == SECRET


def test_a_linked_incoming_folder_is_never_swept_through(storage, secret):
    incoming = storage.root / ".incoming"
    if incoming.exists():
        incoming.rmdir()
    os.utime(secret, (0, 0))  # "older than the lease"
    incoming.symlink_to(secret.parent)
    assert storage.sweep_incoming(older_than=60) == 0
    assert secret.read_bytes() == SECRET
    assert incoming.is_dir() and not incoming.is_symlink()  # replaced by a folder of its own
