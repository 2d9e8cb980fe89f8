"""CacheClient against a live service: publish, restore, and what restore refuses."""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import insert, update

from cachesvc.models import Blob, Version, VersionFile
from cachesvc.storage import pack_key
from cachesvc_client import CacheClient, CacheClientError
from harness.containers import inherited_env
from tests.helpers import ENV, sha
from tests.helpers.client import NAME, SHAPE, client_for, closed_port, enter_container, fill, write

pytestmark = pytest.mark.backends("storage")  # bytes through the service (local), or presigned (S3)


def rebase(files: dict, old: Path, new: Path) -> dict:
    return {new / p.relative_to(old): d for p, d in files.items()}


def test_restore_brings_every_root_back_byte_for_byte(live_server, tmp_path, monkeypatch):
    a = enter_container(monkeypatch, tmp_path / "a")
    files = fill(a)
    report = client_for(live_server.url).publish(NAME, SHAPE, env=ENV)
    assert report.status == "committed" and report.files == len(files)
    assert set(report.roots) == {"inductor", "pch", "triton"}

    b = enter_container(monkeypatch, tmp_path / "b")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")  # restore must set it
    got = client_for(live_server.url, cache_dir=str(b / "cache")).restore(NAME, SHAPE, env=ENV)
    assert got.hit and not got.failed, got
    assert got.files == len(files) and got.bytes_written == sum(map(len, files.values()))
    for path, data in rebase(files, a, b).items():
        assert path.read_bytes() == data, path
        assert bool(path.stat().st_mode & stat.S_IXUSR) == (path.suffix == ".so"), path
    assert not (b / "cache/locks").exists() and not (b / "cache/link.so").exists()
    assert not list(b.rglob("*.tmp")), "no temp file may be left behind"


def test_second_publish_uploads_only_the_changed_file_and_identical_publish_nothing(live_server, tmp_path,
                                                                                      monkeypatch):
    a = enter_container(monkeypatch, tmp_path / "a")
    fill(a)
    client = client_for(live_server.url)
    first = client.publish(NAME, SHAPE, env=ENV)
    assert first.uploaded_blobs == first.files
    write(a / "cache/sj/csj.main.cpp", b"changed")
    second = client.publish(NAME, SHAPE, env=ENV)
    assert second.status == "committed" and second.version_id != first.version_id
    assert second.uploaded_blobs == 1 and second.uploaded_bytes <= len(b"changed") + 64
    third = client.publish(NAME, SHAPE, env=ENV)
    assert third.status == "unchanged" and third.uploaded_blobs == 0 and third.version_id == second.version_id


@pytest.fixture
def published(live_server, tmp_path, monkeypatch, sqlite_url):
    """One version published from container a; returns (url, a, files)."""
    a = enter_container(monkeypatch, tmp_path / "a")
    files = fill(a)
    client_for(live_server.url).publish(NAME, SHAPE, env=ENV)
    return live_server, a, files


@pytest.fixture
def local_live_server(request):
    """live_server on SQLite + the local backend only (tests of client behaviour, not of backends)."""
    return request.getfixturevalue("live_server")


pytestmark_local = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
pytestmark_storage = pytest.mark.parametrize("storage_settings", ["local"], indirect=True)


@pytestmark_local
@pytestmark_storage
def test_restore_skips_files_already_present_and_never_deletes_others(published, tmp_path, monkeypatch):
    server, a, files = published
    b = enter_container(monkeypatch, tmp_path / "b")
    mine = b / "cache/mine/own.txt"
    write(mine, b"not from the cache")
    client = client_for(server.url)
    first = client.restore(NAME, SHAPE, env=ENV)
    assert first.files == len(files)
    again = client.restore(NAME, SHAPE, env=ENV)
    assert again.hit and again.files == 0 and again.files_present == len(files) and again.bytes == 0
    one = b / "cache/sj/csj.main.cpp"
    write(one, b"damaged")
    third = client.restore(NAME, SHAPE, env=ENV)
    assert third.files == 1 and one.read_bytes() == files[a / "cache/sj/csj.main.cpp"]
    assert mine.read_bytes() == b"not from the cache"


@pytestmark_local
@pytestmark_storage
def test_restore_of_unknown_key_is_a_miss_with_a_reason(published, tmp_path, monkeypatch):
    server, _, _ = published
    enter_container(monkeypatch, tmp_path / "b")
    report = client_for(server.url).restore(NAME, "f32[1,1]", env=ENV)
    assert not report.hit and report.reason == "no entry has this key"
    wrong_gpu = client_for(server.url).restore(NAME, SHAPE, env=dict(ENV, device="NVIDIA H100 80GB HBM3"))
    assert not wrong_gpu.hit


@pytestmark_local
@pytestmark_storage
def test_corrupt_blob_is_never_written_and_is_named_in_the_report(published, tmp_path, monkeypatch):
    server, a, files = published
    victim = files[a / "cache/sj/csj.main.cpp"]
    svc = server.app.extensions["cachesvc"]
    with svc.db.session() as s:  # a small file travels in a pack: damage its member in place
        blob = s.get(Blob, sha(victim))
        pack, offset, length = blob.pack_digest, blob.pack_offset, blob.stored_size
    assert pack is not None
    with open(svc.storage.local_path(pack_key(pack)), "r+b") as f:
        f.seek(offset)
        f.write(b"T" * length)
    b = enter_container(monkeypatch, tmp_path / "b")
    report = client_for(server.url).restore(NAME, SHAPE, env=ENV)
    assert report.hit and len(report.failed) == 1 and "csj.main.cpp" in report.failed[0]
    assert not (b / "cache/sj/csj.main.cpp").exists()
    assert (b / "cache/sj/csj.main.so").exists()
    assert not list(b.rglob("*.tmp"))


@pytestmark_local
@pytestmark_storage
def test_manifest_pointing_outside_the_cache_dir_is_refused_whole(published, tmp_path, monkeypatch):
    server, a, files = published
    with server.app.extensions["cachesvc"].db.session() as s:  # what a compromised index could hold
        vid = s.query(Version.id).scalar()
        digest = sha(files[a / "cache/sj/csj.main.cpp"])
        s.execute(insert(VersionFile).values(version_id=vid, root="inductor", path="../../escaped.txt",
                                             digest=digest, size=len(files[a / "cache/sj/csj.main.cpp"]),
                                             mode=0o644))
    b = enter_container(monkeypatch, tmp_path / "b")
    report = client_for(server.url).restore(NAME, SHAPE, env=ENV)
    assert not report.hit and "path rules" in report.reason
    assert not any((b / "cache").iterdir()) or list((b / "cache").rglob("*")) == [b / "cache/.cachesvc"]
    assert not (tmp_path / "escaped.txt").exists() and not (b / "escaped.txt").exists()
    with pytest.raises(CacheClientError):
        client_for(server.url).restore(NAME, SHAPE, env=ENV, strict=True)


@pytestmark_local
@pytestmark_storage
def test_a_manifest_may_not_write_the_clients_own_state_files(published, tmp_path, monkeypatch):
    """Issue 15, item 10: a manifest entry in .cachesvc/ (restore.lock, restored.json) is untrusted: the
    whole manifest is refused, the state file left alone (and publish never sends them: test_roots)."""
    server, a, files = published
    b = enter_container(monkeypatch, tmp_path / "b")
    assert client_for(server.url).restore(NAME, SHAPE, env=ENV).hit
    stamp = (b / "cache/.cachesvc/restored.json").read_bytes()
    with server.app.extensions["cachesvc"].db.session() as s:  # what a compromised index could hold
        vid = s.query(Version.id).scalar()
        data = files[a / "cache/sj/csj.main.cpp"]
        s.execute(insert(VersionFile).values(version_id=vid, root="inductor", path=".cachesvc/restored.json",
                                             digest=sha(data), size=len(data), mode=0o644))
    report = client_for(server.url).restore(NAME, SHAPE, env=ENV)
    assert not report.hit and "path rules" in report.reason and ".cachesvc/" in report.reason
    assert (b / "cache/.cachesvc/restored.json").read_bytes() == stamp


@pytestmark_local
@pytestmark_storage
@pytest.mark.parametrize("merge", [False, True], ids=["no-merge", "merge"])
def test_publishing_a_missing_or_empty_folder_is_refused_and_the_good_version_stays(published, tmp_path, merge):
    """Issue 15, item 10: nothing to publish is an error, never an empty version hiding the key's good one."""
    server, _a, _files = published
    good = client_for(server.url, cache_dir=str(tmp_path / "first")).restore(NAME, SHAPE, env=ENV).version_id
    (tmp_path / "empty/locks").mkdir(parents=True)  # junk only: as empty as no folder
    (tmp_path / "empty/locks/x.lock").write_bytes(b"")
    for folder, why in ((tmp_path / "missing", "missing"), (tmp_path / "empty", "empty")):
        with pytest.raises(CacheClientError, match=f"nothing to publish: {folder} \\({why}\\)"):
            client_for(server.url).publish(NAME, SHAPE, env=ENV, roots={"inductor": str(folder)}, merge=merge)
    again = client_for(server.url, cache_dir=str(tmp_path / "second")).restore(NAME, SHAPE, env=ENV)
    assert again.hit and again.version_id == good


@pytestmark_local
@pytestmark_storage
def test_restore_does_not_write_through_a_symlink_in_the_cache_dir(published, tmp_path, monkeypatch):
    server, _, files = published
    b = enter_container(monkeypatch, tmp_path / "b")
    outside = tmp_path / "outside"
    outside.mkdir()
    (b / "cache/sj").symlink_to(outside)
    report = client_for(server.url).restore(NAME, SHAPE, env=ENV)
    assert report.hit
    assert len(report.failed) == 2 and all("symlink" in f for f in report.failed)
    assert list(outside.iterdir()) == []


def test_service_down_gives_a_miss_quickly_and_strict_raises(tmp_path, monkeypatch):
    enter_container(monkeypatch, tmp_path / "b")
    client = CacheClient(f"http://127.0.0.1:{closed_port()}", timeout=3)
    t = time.monotonic()
    report = client.restore(NAME, SHAPE, env=ENV)
    assert not report.hit and report.reason.startswith("error:")
    assert time.monotonic() - t < 10
    with pytest.raises(CacheClientError):
        client.restore(NAME, SHAPE, env=ENV, strict=True)


def test_service_that_accepts_and_never_answers_gives_a_miss_within_the_timeout(tmp_path, monkeypatch):
    enter_container(monkeypatch, tmp_path / "b")
    with socket.socket() as silent:  # the kernel accepts connections; nobody ever reads or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        client = CacheClient(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=2)
        t = time.monotonic()
        report = client.restore(NAME, SHAPE, env=ENV)
        elapsed = time.monotonic() - t
    assert not report.hit and "error" in report.reason
    assert elapsed < 8, elapsed


@pytestmark_local
@pytestmark_storage
def test_cli_publish_and_restore(published, tmp_path):
    server, a, files = published
    env = inherited_env(("CACHESVC_", "TORCHINDUCTOR_", "TRITON_"))
    b = tmp_path / "cli"
    env.update(HOME=str(b / "home"), TMPDIR=str(b / "tmp"), CACHESVC_URL=server.url,
               CACHESVC_TOKEN=server.app.config["TOKENS"]["write"],  # publishing needs write
               **{f"CACHESVC_ENV_{k.upper()}": v for k, v in ENV.items()})
    for d in ("home", "tmp"):
        (b / d).mkdir(parents=True)
    cli = [sys.executable, "-m", "cachesvc_client.cli"]
    out = subprocess.run(cli + ["restore", "--name", NAME, "--shape", SHAPE, "--cache-dir", str(b / "cache"),
                                "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["hit"] and report["files"] == len(files)
    assert (b / "cache/sj/csj.main.so").read_bytes() == files[a / "cache/sj/csj.main.so"]
    miss = subprocess.run(cli + ["restore", "--name", "other", "--shape", SHAPE, "--strict", "-q"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert miss.returncode == 1 and "miss" in miss.stderr
    write(b / "cache/new/file.py", b"print(1)")
    pub = subprocess.run(cli + ["publish", "--name", NAME, "--shape", SHAPE, "--cache-dir", str(b / "cache"),
                                "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert pub.returncode == 0, pub.stderr
    assert json.loads(pub.stdout)["uploaded_blobs"] == 1
    bad = subprocess.run(cli + ["restore", "--name", NAME, "--shape", SHAPE, "--tag", "novalue"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr


def test_client_imports_and_runs_without_server_dependencies_or_torch(tmp_path):
    code = r'''
import sys, importlib.abc
BLOCK = ("flask", "flask_smorest", "sqlalchemy", "alembic", "boto3", "botocore", "psycopg", "marshmallow",
         "torch", "triton", "cachesvc.")
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith(BLOCK) or name in ("cachesvc",) or any(name.startswith(b + ".") for b in BLOCK):
            raise ImportError(f"blocked: {name}")
sys.meta_path.insert(0, Blocker())
import cachesvc_client
from cachesvc_client import CacheClient, shape_signature, environment
class T:
    shape, dtype = (8, 256), "torch.float32"
assert shape_signature(T(), [T()]) == "f32[8,256],f32[8,256]"
env = environment()
assert env["torch"] == "none", env
r = CacheClient("http://127.0.0.1:9", timeout=1, cache_dir=sys.argv[1]).restore("m", "s")
assert not r.hit
print("OK")
'''
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cache")], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stderr


@pytestmark_local
@pytestmark_storage
def test_restore_warns_when_torch_lives_at_another_path(published, tmp_path, monkeypatch):
    server, _, _ = published
    enter_container(monkeypatch, tmp_path / "b")
    monkeypatch.setattr("cachesvc_client.restore.snapshot.torch_dir", lambda: "/elsewhere/site-packages/torch")
    report = client_for(server.url).restore(NAME, SHAPE, env=ENV)
    assert report.hit and len(report.warnings) == 1 and "/elsewhere/site-packages/torch" in report.warnings[0]


@pytestmark_local
@pytestmark_storage
def test_ranks_restoring_into_one_cache_dir_at_once_write_each_file_once(published, tmp_path):
    server, a, files = published
    b = tmp_path / "shared-host"
    for d in ("home", "tmp", "cache"):
        (b / d).mkdir(parents=True)
    env = inherited_env(("CACHESVC_", "TORCHINDUCTOR_", "TRITON_"))
    env.update(HOME=str(b / "home"), TMPDIR=str(b / "tmp"), TORCHINDUCTOR_CACHE_DIR=str(b / "cache"),
               CACHESVC_URL=server.url, **{f"CACHESVC_ENV_{k.upper()}": v for k, v in ENV.items()})
    code = ("import json; from cachesvc_client import CacheClient\n"
            f"r = CacheClient(timeout=30).restore({NAME!r}, {SHAPE!r})\n"
            "print(json.dumps(r.to_dict()))")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(6)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        reports.append(json.loads(out))
    assert all(r["hit"] and not r["failed"] for r in reports)
    assert sum(r["files"] for r in reports) == len(files), "each file is written by exactly one rank"
    for path, data in rebase(files, a, b).items():
        assert path.read_bytes() == data


@pytestmark_local
@pytestmark_storage
def test_start_restore_finds_what_the_torch_fingerprint_published(live_server, tmp_path, monkeypatch):
    """The background restore keys by envfiles (no torch); the publisher by the torch fingerprint."""
    from cachesvc_client.process import fingerprint

    for name in list(os.environ):
        if name.startswith("CACHESVC_ENV_"):
            monkeypatch.delenv(name)
    a = enter_container(monkeypatch, tmp_path / "a")
    files = fill(a)
    client_for(live_server.url).publish(NAME, SHAPE, env=fingerprint.environment())
    b = enter_container(monkeypatch, tmp_path / "b")
    report = client_for(live_server.url).start_restore(NAME, SHAPE).result(timeout=60)
    assert report.hit and report.files == len(files) and not report.failed, report
    for path, data in rebase(files, a, b).items():
        assert path.read_bytes() == data, path


def test_start_restore_hands_errors_to_the_future(tmp_path, monkeypatch):
    enter_container(monkeypatch, tmp_path / "b")
    client = CacheClient(f"http://127.0.0.1:{closed_port()}", timeout=3)
    assert not client.start_restore(NAME, SHAPE).result(timeout=30).hit
    with pytest.raises(CacheClientError):
        client.start_restore(NAME, SHAPE, strict=True).result(timeout=30)


def test_keying_warnings_name_the_remote_autograd_switch(monkeypatch):
    """What torch keys AOTAutograd entries by (tests/e2e/test_remote_autograd_keying.py shows the miss).
    A stand-in config module: importing torch here would change what later tests of this process see."""
    import types

    from cachesvc_client.publish.keying import keying_warnings

    monkeypatch.delenv("TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE", raising=False)
    monkeypatch.delenv("CI", raising=False)
    config = types.SimpleNamespace(enable_remote_autograd_cache=True)
    monkeypatch.setitem(sys.modules, "torch._functorch.config", config)
    assert len(keying_warnings()) == 1 and "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1" in keying_warnings()[0]
    config.enable_remote_autograd_cache = None
    assert keying_warnings() == []
    # before `import torch` (a publish from a process that never imported it): the environment decides
    monkeypatch.delitem(sys.modules, "torch._functorch.config")
    assert keying_warnings() == []
    monkeypatch.setenv("TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE", "1")
    assert len(keying_warnings()) == 1


def test_keying_warnings_name_ci_where_torch_keys_on_it(monkeypatch):
    """torch 2.13 reads $CI into functorch's error_on_custom_op_aliasing, which keys AOTAutograd
    (tests/e2e/test_remote_autograd_keying.py shows the keys part): a build job on a CI runner is warned,
    unless the option is set explicitly, as the warning tells."""
    import types

    from cachesvc_client.publish.keying import keying_warnings

    monkeypatch.delenv("TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING", raising=False)
    config = types.SimpleNamespace(enable_remote_autograd_cache=None, error_on_custom_op_aliasing=True)
    monkeypatch.setitem(sys.modules, "torch._functorch.config", config)
    monkeypatch.setenv("CI", "true")
    [warning] = keying_warnings()
    assert "CI='true'" in warning and "TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING" in warning
    monkeypatch.setenv("TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING", "0")  # set in both: CI no longer decides
    assert keying_warnings() == []
    monkeypatch.delenv("TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING")
    monkeypatch.setattr(config, "error_on_custom_op_aliasing", False)  # a torch whose option ignores CI
    assert keying_warnings() == []
    del config.error_on_custom_op_aliasing  # a torch without the option
    assert keying_warnings() == []
    monkeypatch.delenv("CI")
    config.error_on_custom_op_aliasing = True
    assert keying_warnings() == []
    # before `import torch` (the CLI publishing a container's files): the installed torch's source decides
    monkeypatch.delitem(sys.modules, "torch._functorch.config")
    monkeypatch.setenv("CI", "1")
    import importlib.util
    from pathlib import Path

    source = Path(importlib.util.find_spec("torch").submodule_search_locations[0], "_functorch", "config.py").read_text()
    assert len(keying_warnings()) == ('default=bool(os.getenv("CI"))' in source)
