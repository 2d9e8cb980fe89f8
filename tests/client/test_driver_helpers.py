"""Triton's driver helper (cuda_utils*.so) travels to where a restored process looks for it.

The helper here is a real shared object built with the C compiler and loaded
with ctypes, so ``/proc/self/maps`` lists it as it lists Triton's. Each test
deletes it afterwards: the mapping stays in this process, and ``loaded`` skips
mapped files that no longer exist, so later publishes in this process see none.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cachesvc_client.process import driver_helpers, roots as roots_mod
from tests.helpers.client import NAME, SHAPE, client_for, enter_container, fill
from tests.helpers import ENV, sha

SUFFIX = f".cpython-{sys.version_info.major}{sys.version_info.minor}-x86_64-linux-gnu.so"
KEY = "a" * 64

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not shutil.which("gcc"),
                                reason="needs Linux (/proc/self/maps) and gcc")


@pytest.fixture
def load_helper(tmp_path):
    """``load_helper(folder)``: build a helper into ``folder/<KEY>/cuda_utils<SUFFIX>``, load it, return its path."""
    made = []

    def load(folder: Path) -> Path:
        src = tmp_path / f"helper{len(made)}.c"
        src.write_text(f"int cachesvc_test_helper_{len(made)}(void) {{ return {len(made)}; }}\n")
        path = folder / KEY / f"cuda_utils{SUFFIX}"
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(src)], check=True)
        ctypes.CDLL(str(path))
        made.append(path)
        return path

    yield load
    for path in made:
        path.unlink(missing_ok=True)


def test_loaded_lists_mapped_helpers_that_still_exist(tmp_path, load_helper):
    helper = load_helper(tmp_path / "t")
    assert str(helper) in driver_helpers.loaded()
    maps = (f"7f00-7f01 r-xp 00000000 08:01 12 {helper}\n"
            f"7f01-7f02 r-xp 00000000 08:01 13 {tmp_path}/t/{KEY}/libother.so\n"
            f"7f02-7f03 r-xp 00000000 08:01 14 /gone/{KEY}/cuda_utils{SUFFIX} (deleted)\n"
            "7f03-7f04 rw-p 00000000 00:00 0\n")
    assert driver_helpers.loaded(maps) == [str(helper)]


def test_compiling_process_publishes_the_helper_under_a_triton_root(tmp_path, monkeypatch, load_helper):
    a = enter_container(monkeypatch, tmp_path / "a")
    helper = load_helper(a / "home/.triton/cache")  # the driver started before Inductor set TRITON_CACHE_DIR
    monkeypatch.setenv("TRITON_CACHE_DIR", str(a / "cache/triton/0"))  # what CachingAutotuner does
    roots = roots_mod.default_roots(str(a / "cache"))
    assert "triton" not in {r.role for r in roots}  # so the snapshot leaves Triton's own dir out

    files, where = [], {}
    roots = driver_helpers.add(files, where, roots)

    assert files == [{"root": "triton", "path": f"{KEY}/cuda_utils{SUFFIX}", "sha256": sha(helper.read_bytes()),
                      "size": helper.stat().st_size, "mode": 0o755}]
    assert where == {("triton", f"{KEY}/cuda_utils{SUFFIX}"): str(helper)}
    assert {r.role: r.path for r in roots}["triton"] == str(a / "home/.triton/cache")


def test_a_helper_a_root_covers_or_outside_tritons_dir_adds_nothing(tmp_path, monkeypatch, load_helper):
    a = enter_container(monkeypatch, tmp_path / "a")
    load_helper(a / "cache/triton/0")  # inside the inductor root: the snapshot walks it
    load_helper(a / "elsewhere")        # not where a restored process would look
    roots = roots_mod.default_roots(str(a / "cache"))
    files, where = [], {}
    assert driver_helpers.add(files, where, roots) == roots and files == []


def test_a_triton_root_set_by_the_user_is_left_as_it_is(tmp_path, monkeypatch, load_helper):
    a = enter_container(monkeypatch, tmp_path / "a")
    load_helper(a / "home/.triton/cache")
    roots = roots_mod.with_exclusions([roots_mod.Root("inductor", str(a / "cache")),
                                       roots_mod.Root("triton", str(a / "custom"))])
    files, where = [], {}
    assert driver_helpers.add(files, where, roots) == roots and files == []


def test_no_helper_loaded_changes_nothing(tmp_path, monkeypatch):
    a = enter_container(monkeypatch, tmp_path / "a")
    roots = roots_mod.default_roots(str(a / "cache"))
    files, where = [], {}
    assert driver_helpers.add(files, where, roots, maps="") == roots and files == [] and where == {}


def test_restore_of_a_compiling_process_snapshot_brings_the_helper_to_tritons_dir(live_server, tmp_path, monkeypatch,
                                                                                load_helper):
    a = enter_container(monkeypatch, tmp_path / "a")
    fill(a)
    helper = load_helper(a / "home/.triton/cache")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(a / "cache/triton/0"))
    report = client_for(live_server.url).publish(NAME, SHAPE, env=ENV)
    assert report.status == "committed" and report.roots["triton"] == str(a / "home/.triton/cache")

    b = enter_container(monkeypatch, tmp_path / "b")  # TRITON_CACHE_DIR unset, as in a new container
    got = client_for(live_server.url, cache_dir=str(b / "cache")).restore(NAME, SHAPE, env=ENV)
    assert got.hit and not got.failed, got
    assert (b / "home/.triton/cache" / KEY / helper.name).read_bytes() == helper.read_bytes()


def test_an_artifact_published_by_a_process_with_the_helper_loaded_is_its_one_file(live_server, tmp_path, monkeypatch,
                                                                                  load_helper):
    """On the H200 the one call's package version carried the helper under a triton root, which an
    artifact fetch refuses ("unknown root role 'triton'"): every restart missed."""
    a = enter_container(monkeypatch, tmp_path / "a")
    load_helper(a / "home/.triton/cache")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(a / "cache/triton/0"))
    package = tmp_path / "model.pt2"
    package.write_bytes(b"a package's bytes")
    client = client_for(live_server.url)
    report = client.publish_precompiled(NAME, SHAPE, str(package), "pt2-package", env=ENV)
    assert report.status == "committed" and set(report.roots) == {"artifact"}, report.roots

    enter_container(monkeypatch, tmp_path / "b")
    got = client_for(live_server.url, cache_dir=str(tmp_path / "b/cache")).restore(NAME, SHAPE, env=ENV,
                                                                                    kind="pt2-package")
    assert got.hit, got.reason
    assert [Path(p).read_bytes() for p in got.artifacts] == [package.read_bytes()]
