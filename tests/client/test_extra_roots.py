"""Every JIT cache a serving engine fills (issue 28, item 4): extra roots named by CACHESVC_EXTRA_ROOTS or
extra_roots=, with the path rules, dedup and verification of the built-in ones; a real torch C++ extension
built in one container loads without a compile in a restarted one."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cachesvc_client import CacheClient
from cachesvc_client.process import roots
from cachesvc_client.shared.keys import InvalidKey
from cachesvc_client.restore.pipeline import LONG_AGO
from tests.helpers import ENV

local_only = [pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
              pytest.mark.parametrize("storage_settings", ["local"], indirect=True)]

#: one container's life: build a one-function CPU extension with torch.utils.cpp_extension (verbose: its build
#: steps go to stdout), call it, then publish (argv[1] == "publish") or only report; prints the .so's mtime.
#: Its source is a plain C function, not load_inline's (which includes torch/extension.h: a 12 CPU-s compile
#: of headers this test does not need); like load_inline's, it is written into the build folder only when its
#: text differs, so a restored folder's older source is not rebuilt.
CONTAINER = r'''
import ctypes, os, sys, time
from torch.utils.cpp_extension import load
SOURCE = 'extern "C" int add_one(int x) { return x + 1; }\n'
started = time.monotonic()
build = os.path.join(os.environ["TORCH_EXTENSIONS_DIR"], "cachesvc_add_one")
src = os.path.join(build, "add_one.cpp")
os.makedirs(build, exist_ok=True)
if not os.path.exists(src) or open(src).read() != SOURCE:
    with open(src, "w") as f:
        f.write(SOURCE)
so = load(name="cachesvc_add_one", sources=[src], is_python_module=False, verbose=True)
print("RESULT", ctypes.CDLL(so).add_one(41), "LOAD_S", round(time.monotonic() - started, 2), flush=True)
assert so == os.path.join(build, "cachesvc_add_one.so"), so
print("SO_MTIME", int(os.stat(so).st_mtime), flush=True)
if sys.argv[1] == "publish":
    from cachesvc_client import CacheClient
    import json
    report = CacheClient(sys.argv[2]).publish("ext", "i32", env=json.loads(sys.argv[3]))
    print("PUBLISHED", report.status, report.roots.get("torch_extensions"), flush=True)
'''


def container(root: Path, **env) -> dict:
    """A fresh container's environment rooted at ``root``: its own HOME, TMPDIR, Inductor cache, extensions."""
    for sub in ("home", "tmp", "ext"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CACHESVC_", "TORCH"))}
    return {**base, "HOME": str(root / "home"), "TMPDIR": str(root / "tmp"), "TORCH_EXTENSIONS_DIR": str(root / "ext"),
            "TORCHINDUCTOR_CACHE_DIR": str(root / "tmp/inductor"), "CACHESVC_TOKEN": os.environ["CACHESVC_TOKEN"],
            **env}


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="needs a C++ compiler")
@local_only[0]
@local_only[1]
def test_a_cpp_extension_is_restored_and_loads_without_a_compile(live_server, tmp_path, monkeypatch):
    import json

    root = tmp_path / "pod"
    built = subprocess.run([sys.executable, "-c", CONTAINER, "publish", live_server.url, json.dumps(ENV)],
                           capture_output=True, text=True, timeout=600,
                           env=container(root, CACHESVC_EXTRA_ROOTS="torch_extensions"))
    assert built.returncode == 0, built.stdout + built.stderr
    assert "RESULT 42" in built.stdout and "c++" in built.stdout  # the cold container compiled
    assert f"PUBLISHED committed {root / 'ext'}" in built.stdout, built.stdout

    shutil.rmtree(root)  # the restarted container: the same paths, empty
    env = container(root)
    for var in ("TORCH_EXTENSIONS_DIR", "HOME", "TMPDIR"):
        monkeypatch.setenv(var, env[var])
    monkeypatch.delenv(roots.EXTRA_ROOTS_VAR, raising=False)  # the known root needs no setting to be restored
    report = CacheClient(live_server.url, cache_dir=env["TORCHINDUCTOR_CACHE_DIR"]).restore("ext", "i32", env=ENV)
    assert report.hit and report.roots["torch_extensions"] == str(root / "ext"), report
    so = root / "ext/cachesvc_add_one/cachesvc_add_one.so"
    assert int(so.stat().st_mtime) == LONG_AGO

    loaded = subprocess.run([sys.executable, "-c", CONTAINER, "load"], capture_output=True, text=True, timeout=600,
                            env=env)
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    assert "RESULT 42" in loaded.stdout
    assert "c++" not in loaded.stdout and "ninja: no work to do" in loaded.stdout, loaded.stdout
    assert f"SO_MTIME {LONG_AGO}" in loaded.stdout  # the restored library, not a rebuilt one


def test_extra_roots_follow_the_rules_of_the_built_in_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLASHINFER_WORKSPACE_BASE", raising=False)
    monkeypatch.delenv("DG_JIT_CACHE_DIR", raising=False)
    monkeypatch.setenv(roots.EXTRA_ROOTS_VAR, f"flashinfer, deep_gemm, mine={tmp_path / 'mine'}")
    assert roots.extra_roots() == {"flashinfer": str(tmp_path / "home/.cache/flashinfer"),
                                   "deep_gemm": str(tmp_path / "home/.deep_gemm"), "mine": str(tmp_path / "mine")}
    assert roots.extra_roots({"mine": str(tmp_path / "other")})["mine"] == str(tmp_path / "other")  # the argument wins
    for bad, why in (("nameless", "needs a folder"), ("rel=some/dir", "absolute"), ("inductor=/x", "built-in"),
                     ("Bad Name=/x", "must match")):
        monkeypatch.setenv(roots.EXTRA_ROOTS_VAR, bad)
        with pytest.raises(InvalidKey, match=why):
            roots.extra_roots()
    monkeypatch.delenv(roots.EXTRA_ROOTS_VAR)
    cache = tmp_path / "cache"
    listed = {r.role: r for r in roots.default_roots(str(cache), {"dup": str(cache), "inner": str(cache / "jit")})}
    assert "dup" not in listed  # the inductor root's folder already: not published twice
    assert listed["inner"].path == str(cache / "jit") and str(cache / "jit") in listed["inductor"].exclude


@local_only[0]
@local_only[1]
def test_a_named_root_is_published_restored_and_verified_like_the_others(live_server, tmp_path, monkeypatch):
    src = tmp_path / "a/jit"
    (src / "ops").mkdir(parents=True)
    (src / "ops/kernel.so").write_bytes(b"\x7fELF" + b"k" * 4000)
    (src / "ops/lock").write_text("")  # junk, as in every root
    (tmp_path / "a/cache").mkdir()
    monkeypatch.setenv(roots.EXTRA_ROOTS_VAR, f"engine={src}")
    published = CacheClient(live_server.url).publish("eng", "s", env=ENV, roots={"inductor": str(tmp_path / "a/cache")})
    assert published.status == "committed" and published.roots["engine"] == str(src) and published.files == 1
    monkeypatch.delenv(roots.EXTRA_ROOTS_VAR)
    client = CacheClient(live_server.url, cache_dir=str(tmp_path / "b/cache"))
    unnamed = client.restore("eng", "s", env=ENV)
    assert not unnamed.hit and roots.EXTRA_ROOTS_VAR in unnamed.reason  # nowhere to put it: said so
    dest = tmp_path / "b/jit"
    got = client.restore("eng", "s", env=ENV, extra_roots={"engine": str(dest)})
    assert got.hit and (dest / "ops/kernel.so").read_bytes() == (src / "ops/kernel.so").read_bytes()
    assert not (dest / "ops/lock").exists()
    monkeypatch.setenv(roots.EXTRA_ROOTS_VAR, "engine")  # a custom root needs its folder
    bad = client.restore("eng", "s", env=ENV)
    assert not bad.hit and "needs a folder" in bad.reason
    env_file = tmp_path / "env.json"
    env_file.write_text(__import__("json").dumps(ENV))
    cli = subprocess.run([sys.executable, "-m", "cachesvc_client.cli", "publish", "--url", live_server.url, "--name",
                          "eng", "--shape", "s", "--env-file", str(env_file), "--cache-dir", str(tmp_path / "a/cache")],
                         capture_output=True, text=True, env={**os.environ, roots.EXTRA_ROOTS_VAR: "engine"})
    assert cli.returncode == 2 and roots.EXTRA_ROOTS_VAR in cli.stderr and "Traceback" not in cli.stderr, cli.stderr
