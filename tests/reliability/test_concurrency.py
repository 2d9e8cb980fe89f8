"""Issue 5, item 4: concurrency, with real processes.

    16 ranks restoring one cache dir  -> test_concurrency_16_processes_restore_one_dir_each_file_written_once_no_half_file
    8 publishers of one key           -> test_concurrency_8_processes_publish_identical_content_one_version
                                         test_concurrency_8_processes_publish_different_content_no_blob_lost
    8 merged publishers of one key    -> test_concurrency_8_merged_publishers_newest_version_holds_every_file
                                         (issue 15, item 4; SQLite + local and PostgreSQL + S3)
    two service processes             -> test_concurrency_two_service_processes_share_one_postgres_and_one_bucket
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from cachesvc import config, db as cachesvc_db
from cachesvc.content import packs
from cachesvc.models import Blob, Version, VersionFile
from cachesvc.storage import from_url
from cachesvc_client import CacheClient
from tests.helpers import ENV
from tests.helpers.restores import (ENV_VARS, NAME, SHAPE, assert_no_half_file, final_files, make_files,
                                    publish_files, sha, temp_files, write_files)
from tests.reliability.faults import client_env

REPO = Path(__file__).resolve().parents[2]


def _start_together(codes, envs, go: Path, timeout: float = 180):
    """Start one process per code, release them at once (they wait for ``go``), return their JSON outputs."""
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for code, env in zip(codes, envs)]
    time.sleep(1.0)  # let them import
    go.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


WAIT = "import os, time\nwhile not os.path.exists({go!r}): time.sleep(0.005)\n"


def test_concurrency_16_processes_restore_one_dir_each_file_written_once_no_half_file(tmp_path, start_service):
    svc = start_service()
    sizes = {f"fxgraph/k{i % 7}/e{i}": 20_000 + 5_000 * i for i in range(30)} | {"sj/big.so": 3_000_000}
    files = make_files(tmp_path / "src", sizes)
    assert publish_files(svc.url, svc.token, tmp_path / "src").status == "committed"
    expected = tmp_path / "expected.json"
    expected.write_text(json.dumps({rel: sha(d) for rel, d in files.items()}))

    host = tmp_path / "host"  # one host: one HOME, TMPDIR and cache dir for all ranks
    env = {**client_env({"CACHESVC_URL": svc.url, "CACHESVC_TOKEN": svc.token}, host), **ENV_VARS}
    cache = Path(env["TORCHINDUCTOR_CACHE_DIR"])
    go = tmp_path / "go"
    # Each rank restores, then reads every file back as the app would and checks it whole.
    code = (WAIT.format(go=str(go)) +
            "import hashlib, json, sys\nfrom cachesvc_client import CacheClient\n"
            f"r = CacheClient(timeout=60).restore({NAME!r}, {SHAPE!r}).to_dict()\n"
            f"exp = json.load(open({str(expected)!r}))\n"
            f"r['bad'] = [p for p, h in exp.items() if hashlib.sha256(open({str(cache)!r} + '/' + p, 'rb').read())"
            ".hexdigest() != h]\n"
            "print(json.dumps(r))")

    seen_half, watching = [], threading.Event()

    def watch():  # a reader polling the final paths the whole time: it must only ever see whole files
        while not watching.is_set():
            for rel, path in final_files(cache).items():
                try:
                    data = path.read_bytes()
                except FileNotFoundError:
                    continue
                if sha(data) != sha(files[rel]):
                    seen_half.append(rel)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        reports = _start_together([code] * 16, [env] * 16, go)
    finally:
        watching.set()
        watcher.join()
    assert not seen_half, f"a reader saw half-written files: {sorted(set(seen_half))[:5]}"
    assert all(r["hit"] and not r["failed"] and not r["bad"] for r in reports), reports
    assert sum(r["files"] for r in reports) == len(files), "each file is written by exactly one rank"
    assert sum(r["files_present"] for r in reports) == 15 * len(files)
    assert not temp_files(cache)
    assert_no_half_file(cache, files)
    assert set(final_files(cache)) == set(files)


def _production(postgres_url, s3_server, bucket):
    return {"CACHESVC_DATABASE_URL": postgres_url, **s3_server.service_env(bucket)}


def _publishers(tmp_path, svc, contents, go, merge=False):
    """One publishing process per dict of files (each from its own folder), released together."""
    codes, envs = [], []
    for i, files in enumerate(contents):
        src = tmp_path / f"pub{i}"
        for rel, data in files.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes(data)
        codes.append(WAIT.format(go=str(go)) +
                     "import json, sys\nfrom pathlib import Path\n"
                     "from tests.helpers.restores import publish_files\n"
                     f"r = publish_files({svc.url!r}, {svc.token!r}, Path({str(src)!r}), merge={merge!r})\n"
                     "print(json.dumps(r.to_dict()))")
        envs.append(dict(os.environ, PYTHONPATH=str(REPO)))
    return _start_together(codes, envs, go)


def _versions(url: str):
    db = cachesvc_db.Database(url)
    try:
        with db.session() as s:
            versions = s.execute(select(Version.id, Version.state, Version.manifest_digest)).all()
            digests = {vid: {d for d, in s.execute(select(VersionFile.digest).where(VersionFile.version_id == vid))}
                       for vid, _, _ in versions}
        return versions, digests
    finally:
        db.engine.dispose()


def test_concurrency_8_processes_publish_identical_content_one_version(tmp_path, postgres_url, s3_server,
                                                                       start_service):
    svc = start_service(env=_production(postgres_url, s3_server, s3_server.new_bucket()), workers=4)
    files = {f"fxgraph/k{i}/entry": os.urandom(50_000) for i in range(10)}
    reports = _publishers(tmp_path, svc, [files] * 8, tmp_path / "go")
    versions, _ = _versions(postgres_url)
    committed = [v for v in versions if v.state == "committed"]
    assert len(committed) == 1, versions  # no duplicate version of identical content
    assert {r["version_id"] for r in reports} == {committed[0].id}
    assert sorted(r["status"] for r in reports).count("committed") == 1, reports
    restored = CacheClient(svc.url, svc.token, cache_dir=str(tmp_path / "ctr"), timeout=30).restore(NAME, SHAPE,
                                                                                                   env=ENV)
    assert restored.hit and restored.files == len(files) and not restored.failed
    assert_no_half_file(tmp_path / "ctr", files)


def test_concurrency_8_processes_publish_different_content_no_blob_lost(tmp_path, postgres_url, s3_server,
                                                                        start_service):
    bucket = s3_server.new_bucket()
    svc = start_service(env=_production(postgres_url, s3_server, bucket), workers=4)
    shared = {f"fxgraph/shared{i}/entry": os.urandom(40_000) for i in range(6)}
    contents = [{**shared, f"fxgraph/own/entry{i}": os.urandom(30_000)} for i in range(8)]
    reports = _publishers(tmp_path, svc, contents, tmp_path / "go")
    assert all(r["status"] == "committed" for r in reports), reports
    versions, digests = _versions(postgres_url)
    assert sorted(v.state for v in versions) == ["committed"] * 8, versions
    assert len({v.manifest_digest for v in versions}) == 8
    assert {r["version_id"] for r in reports} == {v.id for v in versions}

    settings = config.load({"DATABASE_URL": postgres_url, **s3_server.settings(bucket, "cachesvc")}, environ={})
    storage = from_url(settings.STORAGE_URL, config.s3_options(settings))
    db = cachesvc_db.Database(postgres_url)
    try:
        with db.session() as s:
            rows = {b.digest: b for b in s.scalars(select(Blob))}
            s.expunge_all()
            last = s.scalars(select(Version.id).order_by(Version.commit_seq.desc()).limit(1)).one()
    finally:
        db.engine.dispose()
    for vid, names in digests.items():  # no blob lost: every file of every version is stored (loose or packed)
        assert len(names) == 7
        for d in names:
            assert d in rows and packs.stored_somewhere(storage, rows[d]), (vid, d)
    newest = next(r for r in reports if r["version_id"] == last)  # the newest is the one committed last
    i = next(i for i, r in enumerate(reports) if r is newest)
    restored = CacheClient(svc.url, svc.token, cache_dir=str(tmp_path / "ctr"), timeout=30).restore(NAME, SHAPE,
                                                                                                   env=ENV)
    assert restored.hit and restored.version_id == newest["version_id"] and not restored.failed
    assert_no_half_file(tmp_path / "ctr", contents[i])
    assert set(final_files(tmp_path / "ctr")) == set(contents[i])


@pytest.mark.parametrize("production", [False, True], ids=["sqlite-local", "postgres-s3"])
def test_concurrency_8_merged_publishers_newest_version_holds_every_file(tmp_path, production, postgres_url,
                                                                        s3_server, start_service):
    """Issue 15, item 4: 8 processes that restored one version each add a shape and publish with merge at
    once; whatever order their creates and commits interleave in, the newest version holds every shape."""
    env = _production(postgres_url, s3_server, s3_server.new_bucket()) if production else {}
    svc = start_service(env=env, workers=4)
    base = {f"fxgraph/base{i}/entry": os.urandom(20_000) for i in range(3)}
    write_files(tmp_path / "base", base)
    assert publish_files(svc.url, svc.token, tmp_path / "base", merge=True).status == "committed"
    contents = [{**base, f"fxgraph/own{i}/entry": os.urandom(30_000 + i)} for i in range(8)]
    reports = _publishers(tmp_path, svc, contents, tmp_path / "go", merge=True)
    assert all(r["status"] == "committed" for r in reports), reports
    everything = {rel: data for files in contents for rel, data in files.items()}
    restored = CacheClient(svc.url, svc.token, cache_dir=str(tmp_path / "ctr"), timeout=30).restore(NAME, SHAPE,
                                                                                                   env=ENV)
    assert restored.hit and not restored.failed
    assert set(final_files(tmp_path / "ctr")) == set(everything), "the newest version lacks a publisher's files"
    assert_no_half_file(tmp_path / "ctr", everything)


def test_concurrency_two_service_processes_share_one_postgres_and_one_bucket(tmp_path, postgres_url, s3_server,
                                                                             start_service):
    env = _production(postgres_url, s3_server, s3_server.new_bucket())
    one, two = start_service("one", env), start_service("two", env)
    files = make_files(tmp_path / "src", {f"fxgraph/k{i}/entry": 30_000 for i in range(5)})
    assert publish_files(one.url, one.token, tmp_path / "src").status == "committed"
    restored = CacheClient(two.url, two.token, cache_dir=str(tmp_path / "a"), timeout=30).restore(NAME, SHAPE,
                                                                                                 env=ENV)
    assert restored.hit and restored.files == len(files) and not restored.failed
    assert_no_half_file(tmp_path / "a", files)

    shutil.rmtree(tmp_path / "src")  # a new version through the other one, back through the first
    files = make_files(tmp_path / "src", {"fxgraph/new/entry": 20_000})
    report = publish_files(two.url, two.token, tmp_path / "src")
    assert report.status == "committed"
    restored = CacheClient(one.url, one.token, cache_dir=str(tmp_path / "b"), timeout=30).restore(NAME, SHAPE,
                                                                                                 env=ENV)
    assert restored.hit and restored.version_id == report.version_id
    assert set(final_files(tmp_path / "b")) == set(files)
