"""Issue 15, item 5: no temp file of a restore remains once ``restore()`` returns, by any path.

    cut at the deadline           -> tests/reliability/test_deadlines.py (every test checks temp_files)
    the final rename fails        -> test_a_rename_that_fails_mid_restore_leaves_no_temp_file (a folder appears
                                     at the target while its blob downloads, as another process could make it)
                                     test_place_removes_its_temp_files_whatever_fails (the rename, the copies)
    a file and a folder at a path -> test_a_manifest_with_a_path_as_file_and_folder_is_refused_whole
    the disk full                 -> tests/reliability/test_faults.py::test_fault_disk_full_during_restore_...
    bad bytes                     -> tests/client/test_bounded_decoding.py, test_publish_restore.py::
                                     test_corrupt_blob_is_never_written_and_is_named_in_the_report
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import insert

from cachesvc.models import Version, VersionFile
from cachesvc_client import CacheClient
from cachesvc_client.restore.place import place
from tests.helpers import ENV, sha
from tests.helpers.restores import SHAPE, final_files, publish_files, temp_files, write_files
from tests.reliability.http_faults import FaultyHTTP

NAME = "temps"


@pytest.fixture
def database_url(sqlite_url):
    return sqlite_url


@pytest.fixture
def storage_settings(local_storage_settings):  # blobs through the service: through the proxy
    return local_storage_settings


def publish(url: str, src: Path, files: dict) -> None:
    write_files(src, files)
    assert publish_files(url, None, src, name=NAME).status == "committed"


def test_a_rename_that_fails_mid_restore_leaves_no_temp_file(live_server, tmp_path):
    files = {"sj/slow.so": os.urandom(400_000), "fxgraph/k/entry": b"graph" * 100}
    publish(live_server.url, tmp_path / "src", files)
    cache = tmp_path / "ctr"
    target = cache / "sj/slow.so"
    seen_temp = threading.Event()

    def another_process_makes_a_folder_there():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not seen_temp.is_set():
            if target.parent.exists() and any(".cachesvc-" in p.name for p in target.parent.iterdir()):
                seen_temp.set()
                (target / "inside").mkdir(parents=True)
            time.sleep(0.005)

    slow = sha(files["sj/slow.so"])
    with FaultyHTTP(live_server.port, fault=lambda path: "trickle-body" if slow in path else None,
                    delay=0.05, chunk=16 << 10) as proxy:
        racer = threading.Thread(target=another_process_makes_a_folder_there)
        racer.start()
        report = CacheClient(proxy.url, cache_dir=str(cache), timeout=30).restore(NAME, SHAPE, env=ENV)
        racer.join()
    assert seen_temp.is_set(), "the folder must appear while the blob downloads"
    assert report.hit and len(report.failed) == 1 and "slow.so" in report.failed[0], report
    assert "directory" in report.failed[0].lower(), report.failed
    assert not temp_files(cache), "the verified temp file is gone though its rename failed"
    assert set(final_files(cache)) == {"fxgraph/k/entry"}


def test_place_removes_its_temp_files_whatever_fails(tmp_path):
    def temp(name: str) -> str:
        path = tmp_path / f".cachesvc-{os.getpid()}-{name}.tmp"
        path.write_bytes(b"verified")
        return str(path)

    (tmp_path / "a-folder" / "inside").mkdir(parents=True)
    with pytest.raises(IsADirectoryError):
        place(temp("rename"), [(str(tmp_path / "a-folder"), 0o644)])
    (tmp_path / "not-a-folder").write_bytes(b"a file")
    with pytest.raises(OSError):  # the copy to a second target cannot make its folder
        place(temp("copy"), [(str(tmp_path / "first"), 0o644), (str(tmp_path / "not-a-folder" / "x"), 0o644)])
    assert not temp_files(tmp_path) and not (tmp_path / "first").exists()
    place(temp("fine"), [(str(tmp_path / "one"), 0o755), (str(tmp_path / "sub" / "two"), 0o644)])
    assert (tmp_path / "one").read_bytes() == (tmp_path / "sub" / "two").read_bytes() == b"verified"
    assert os.stat(tmp_path / "one").st_mode & 0o777 == 0o755 and not temp_files(tmp_path)


def test_a_manifest_with_a_path_as_file_and_folder_is_refused_whole(live_server, tmp_path):
    files = {"a": b"file a", "c": b"file c"}
    publish(live_server.url, tmp_path / "src", files)
    with live_server.app.extensions["cachesvc"].db.session() as s:  # what a broken or hostile index could hold
        vid = s.query(Version.id).scalar()
        s.execute(insert(VersionFile).values(version_id=vid, root="inductor", path="a/b", digest=sha(b"file c"),
                                             size=len(b"file c"), mode=0o644))
    cache = tmp_path / "ctr"
    report = CacheClient(live_server.url, cache_dir=str(cache), timeout=30).restore(NAME, SHAPE, env=ENV)
    assert not report.hit and "path rules" in report.reason and "inductor:a is listed as a file and as a folder" \
        in report.reason, report.reason
    assert not final_files(cache) and not temp_files(cache)
