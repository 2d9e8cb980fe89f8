"""cachesvc_client.process.roots: where each root lives, what is junk, and the walk."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cachesvc_client.process import roots
from cachesvc_client.process.roots import ROLES, Root, default_roots, is_junk, resolve_root, walk


def run_python(code: str, env: dict, timeout: float = 120) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bare_env(tmp_path: Path, **extra: str) -> dict:
    """A minimal environment: PATH and PYTHONPATH only, plus fresh HOME and TMPDIR and ``extra``."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    env = {k: os.environ[k] for k in ("PATH", "PYTHONPATH") if k in os.environ}
    env.update(HOME=str(home), TMPDIR=str(tmp), USER="alice")
    env.update(extra)
    return env


RESOLVE_ALL = """
    import json
    from cachesvc_client.process import roots
    print(json.dumps({r: roots.resolve_root(r, None) for r in roots.ROLES}))
"""


# ------------------------------------------------------------------ resolution


def test_resolution_follows_the_restoring_process(tmp_path):
    """Roles resolve against the process's own TMPDIR, user, HOME and cache dir."""
    env = bare_env(tmp_path)
    got = run_python(RESOLVE_ALL, env)
    tmp, home = env["TMPDIR"], env["HOME"]
    assert got == {
        "inductor": f"{tmp}/torchinductor_alice",
        "pch": f"{tmp}/torchinductor_alice/precompiled_headers",
        "memo": f"{tmp}/torchinductor_alice/cache",
        "triton": f"{home}/.triton/cache",
        "nv": f"{home}/.nv/ComputeCache",
        "vllm": f"{home}/.cache/vllm/torch_compile_cache",
        "vllm_aot": f"{home}/.cache/vllm/torch_aot_compile",
    }

    other = tmp_path / "other"
    other.mkdir()
    env = bare_env(other, TORCHINDUCTOR_CACHE_DIR=str(other / "cache"), LOGNAME="bob",
                   TRITON_HOME=str(other / "th"), CUDA_CACHE_PATH=str(other / "nv"), VLLM_CACHE_ROOT=str(other / "v"))
    got = run_python(RESOLVE_ALL, env)
    assert got == {
        "inductor": str(other / "cache"),
        # LOGNAME comes before USER for getpass.getuser(); the PCH ignores TORCHINDUCTOR_CACHE_DIR.
        "pch": f"{other}/tmp/torchinductor_bob/precompiled_headers",
        "memo": f"{other}/tmp/torchinductor_bob/cache",
        "triton": f"{other}/th/.triton/cache",
        "nv": str(other / "nv"),
        "vllm": str(other / "v" / "torch_compile_cache"),
        "vllm_aot": str(other / "v" / "torch_aot_compile"),
    }


def test_user_name_is_sanitised(tmp_path):
    got = run_python(RESOLVE_ALL, bare_env(tmp_path, USER="dom\\al:ice"))
    assert got["pch"] == f"{tmp_path}/tmp/torchinductor_dom_al_ice/precompiled_headers"


def test_resolution_matches_torch(tmp_path):
    """The replicated rules give the very folders torch 2.13 uses, in a process of its own."""
    pytest.importorskip("torch")
    code = """
        import json, os
        from cachesvc_client.process import roots
        mine = {r: roots.resolve_root(r, None) for r in ("inductor", "pch", "memo")}
        mine["default"] = roots.default_cache_dir()
        from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir
        from torch._inductor.codecache import _HEADER_DIR
        from torch._inductor.runtime.caching.implementations import _OnDiskCacheImpl
        theirs = {"inductor": cache_dir(), "pch": _HEADER_DIR, "memo": str(_OnDiskCacheImpl()._base_dir),
                  "default": default_cache_dir()}
        print(json.dumps({"mine": mine, "theirs": theirs}))
    """
    for case, extra in (("default", {}), ("custom", {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "custom" / "ind")})):
        base = tmp_path / case
        base.mkdir(exist_ok=True)
        out = run_python(code, bare_env(base, **extra))
        assert out["mine"] == out["theirs"], case
        assert out["mine"]["pch"].startswith(str(base / "tmp")), case


def test_explicit_cache_dir_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "from-env"))
    assert resolve_root("inductor", str(tmp_path / "given")) == str(tmp_path / "given")
    assert resolve_root("inductor", None) == str(tmp_path / "from-env")
    assert resolve_root("inductor", "") == str(tmp_path / "from-env")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert resolve_root("inductor", None) == roots.default_cache_dir()
    monkeypatch.chdir(tmp_path)
    assert resolve_root("inductor", "rel") == str(tmp_path / "rel")


def test_triton_rules(tmp_path, monkeypatch):
    for var in ("TRITON_CACHE_DIR", "TRITON_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_root("triton") == str(tmp_path / "home" / ".triton" / "cache")
    monkeypatch.setenv("TRITON_HOME", str(tmp_path / "th"))
    assert resolve_root("triton") == str(tmp_path / "th" / ".triton" / "cache")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "tc"))
    assert resolve_root("triton") == str(tmp_path / "tc")
    monkeypatch.setenv("TRITON_CACHE_DIR", "  ")  # blank: Triton falls back to its default
    assert resolve_root("triton") == str(tmp_path / "th" / ".triton" / "cache")


def test_nv_rules(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_CACHE_PATH", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_root("nv") == str(tmp_path / ".nv" / "ComputeCache")
    monkeypatch.setenv("CUDA_CACHE_PATH", str(tmp_path / "cc"))
    assert resolve_root("nv") == str(tmp_path / "cc")


@pytest.mark.parametrize("role", ["", "Inductor", "triton_cache", "../etc", "bogus"])
def test_unknown_role(role):
    with pytest.raises(ValueError):
        resolve_root(role, "/tmp/x")


def test_roles_pass_the_key_rules():
    from cachesvc_client.shared import keys

    for role in ROLES:
        assert keys.check_role(role) == role


# --------------------------------------------------------------- default roots


@pytest.fixture
def no_root_env(monkeypatch, tmp_path):
    for var in ("TRITON_CACHE_DIR", "TRITON_HOME", "CUDA_CACHE_PATH", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_default_roots_custom_cache_dir(tmp_path, no_root_env):
    cache = str(tmp_path / "cache")
    got = default_roots(cache)
    assert [r.role for r in got] == list(ROLES)
    assert got[0] == Root("inductor", cache)
    assert {r.role: r.path for r in got} == {role: resolve_root(role, cache) for role in ROLES}
    assert all(r.exclude == () for r in got)


def test_triton_inside_the_inductor_root_is_left_out(tmp_path, no_root_env, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache / "triton" / "0"))  # what Inductor sets
    assert "triton" not in [r.role for r in default_roots(str(cache))]
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    assert "triton" not in [r.role for r in default_roots(str(cache))]
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache-triton"))  # a sibling, not inside
    assert "triton" in [r.role for r in default_roots(str(cache))]


def test_default_cache_dir_nests_pch_and_memo(no_root_env):
    """With the default cache dir, pch and memo lie inside the inductor root: excluded from it, not lost."""
    default = roots.default_cache_dir()
    got = {r.role: r for r in default_roots(default)}
    assert got["inductor"].path == default
    assert got["pch"].path == os.path.join(default, "precompiled_headers")
    assert got["memo"].path == os.path.join(default, "cache")
    assert got["inductor"].exclude == (got["memo"].path, got["pch"].path)
    assert got["pch"].exclude == got["memo"].exclude == ()


def test_with_exclusions_and_duplicates(tmp_path):
    a, b, c = str(tmp_path / "a"), str(tmp_path / "a" / "b"), str(tmp_path / "ab")
    got = roots.with_exclusions([Root("inductor", a), Root("pch", b), Root("memo", c)])
    assert got == [Root("inductor", a, (b,)), Root("pch", b), Root("memo", c)]


# ------------------------------------------------------------------------ junk


@pytest.mark.parametrize("relpath", [
    "locks/c244b2rga7kqcbbf2xhybporem2yeo55qusvywqyipbcdmkdmkrr.lock",
    "locks/anything",
    "precompiled_headers/locks/cgd6.lock",
    "fxgraph/37/abc.lock",
    "dynamo/code_state_x.pkl.lock",
    "dynamo/code_state_x.pkl.tmp",
    "e6/.12345.139872.tmp",
    "cutedsl_compile_cache/tmpa1b2c3.o.tmp",
    "halide-runtime-host-abc/lock",
    "should_pad/dir.lock",
    "triton/0/ABCDEF/tmp.pid_123_4f1c/kernel.cubin",
    "ABCDEF/kernel.json.tmp.pid_12_999",
    "e6/__pycache__/ce6.cpython-311.pyc",
    "x.pyc",
    ".cachesvc/restored.json",
    ".cachesvc/restore.lock",
    "sj/.cachesvc-abc123.tmp",
    "sj/csj.main.so.cachesvc-1-2.tmp",
    "",
])
def test_junk(relpath):
    assert is_junk(relpath)


@pytest.mark.parametrize("relpath", [
    "fxgraph/37/f37gu27/jwtwoteq6cnuzxi7f2",
    "aotautograd/aq5c7hbd/rocbfaa4a6yjt",
    "sj/csjw4tlfz5ekrpcyi6.main.so",
    "e6/ce6swwi3uzp3vf6k5q75.py",
    "cgd6nmtur5v3lbowi67iuc3rxmddbupgu3iffcrhobeg3mel4d42.h.gch",
    "cgd6nmtur5v3lbowi67iuc3rxmddbupgu3iffcrhobeg3mel4d42.h",
    "triton/0/ABCDEF/__grp__triton_poi_fused_0.json",
    "triton/0/ABCDEF/triton_poi_fused_0.cubin",
    "dynamo/code_state_x.pkl",
    "halide-runtime-host-abc/done",
    "lockstep/file",
    "notes.tmpl",
    "a/tmp/b",
    "locks",  # a file called locks is not the lock folder
    "tmp.pid_1",
])
def test_not_junk(relpath):
    assert not is_junk(relpath)


# ------------------------------------------------------------------------ walk


def make_tree(base: Path) -> Path:
    root = base / "root"
    (root / "fxgraph" / "37").mkdir(parents=True)
    (root / "fxgraph" / "37" / "entry").write_bytes(b"x" * 10)
    (root / "sj").mkdir()
    so = root / "sj" / "k.main.so"
    so.write_bytes(b"elf" * 100)
    so.chmod(0o755)
    (root / "a.txt").write_text("a")
    (root / "a").mkdir()
    (root / "a" / "b").write_text("bb")
    (root / "locks").mkdir()
    (root / "locks" / "k.lock").write_text("")
    (root / "sj" / ".123.456.tmp").write_text("partial")
    (root / "T" / "tmp.pid_1_2").mkdir(parents=True)
    (root / "T" / "tmp.pid_1_2" / "k.cubin").write_text("partial")
    (root / "T" / "k.cubin").write_text("whole")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "m.cpython-311.pyc").write_text("")
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    os.symlink(outside, root / "linkdir")
    os.symlink(outside / "secret", root / "linkfile")
    os.symlink(root / "missing", root / "dangling")
    os.mkfifo(root / "fifo")
    (root / "nested-root").mkdir()
    (root / "nested-root" / "big.gch").write_text("pch")
    return root


def test_walk(tmp_path):
    root = make_tree(tmp_path)
    rows = list(walk(str(root)))
    assert [r[0] for r in rows] == ["T/k.cubin", "a.txt", "a/b", "fxgraph/37/entry", "nested-root/big.gch",
                                    "sj/k.main.so"]
    by_rel = {rel: (abspath, size, mode) for rel, abspath, size, mode in rows}
    assert by_rel["sj/k.main.so"] == (str(root / "sj" / "k.main.so"), 300, 0o755)
    assert by_rel["a/b"][1] == 2
    assert by_rel["a.txt"][2] == stat.S_IMODE(os.stat(root / "a.txt").st_mode)
    assert all(os.path.isabs(a) and os.path.isfile(a) for a, _, _ in by_rel.values())
    assert list(walk(str(root))) == rows  # deterministic


def test_walk_exclude(tmp_path):
    root = make_tree(tmp_path)
    rels = [r[0] for r in walk(str(root), exclude=[str(root / "nested-root"), str(root / "fxgraph")])]
    assert rels == ["T/k.cubin", "a.txt", "a/b", "sj/k.main.so"]


def test_walk_missing_root_and_file_root(tmp_path):
    assert list(walk(str(tmp_path / "absent"))) == []
    (tmp_path / "f").write_text("x")
    assert list(walk(str(tmp_path / "f"))) == []


def test_walk_follows_a_symlinked_root_only(tmp_path):
    root = make_tree(tmp_path)
    os.symlink(root, tmp_path / "alias")
    rels = [r[0] for r in walk(str(tmp_path / "alias"))]
    assert rels == [r[0] for r in walk(str(root))]
    assert not any(r.startswith("linkdir") for r in rels)


def test_walk_default_roots_publishes_each_file_once(tmp_path):
    """The inductor root's walk skips the pch/memo folders nested in it (default cache dir)."""
    env = bare_env(tmp_path)
    default = tmp_path / "tmp" / "torchinductor_alice"
    (default / "precompiled_headers").mkdir(parents=True)
    (default / "precompiled_headers" / "h.h.gch").write_text("pch")
    (default / "cache" / "should_pad").mkdir(parents=True)
    (default / "cache" / "should_pad" / "k").write_text("memo")
    (default / "fxgraph").mkdir()
    (default / "fxgraph" / "e").write_text("e")
    out = run_python("""
        import json
        from cachesvc_client.process import roots
        seen = []
        for r in roots.default_roots(None):
            seen += [[r.role, rel, abspath] for rel, abspath, _, _ in roots.walk(r.path, exclude=r.exclude)]
        print(json.dumps(seen))
    """, env)
    assert sorted(map(tuple, out)) == [
        ("inductor", "fxgraph/e", str(default / "fxgraph" / "e")),
        ("memo", "should_pad/k", str(default / "cache" / "should_pad" / "k")),
        ("pch", "h.h.gch", str(default / "precompiled_headers" / "h.h.gch")),
    ]


@pytest.mark.slow
def test_real_compile_roots(tmp_path):
    """A real torch.compile in a fresh process writes only to the inductor and pch roots; no junk is walked."""
    pytest.importorskip("torch")
    env = bare_env(tmp_path, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    code = """
        import json, torch
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        with torch.no_grad():
            torch.compile(m)(torch.randn(2, 16))
        from cachesvc_client.process import roots
        out = {}
        for r in roots.default_roots(None):
            out[r.role] = [rel for rel, _, _, _ in roots.walk(r.path, exclude=r.exclude)]
        print(json.dumps(out))
    """
    try:
        out = run_python(code, env, timeout=300)
        _check_real_compile(tmp_path, env, out)
    finally:  # the PCH is ~150 MB; do not leave it in pytest's kept temp dirs
        import shutil
        shutil.rmtree(tmp_path / "tmp", ignore_errors=True)


def _check_real_compile(tmp_path: Path, env: dict, out: dict) -> None:
    assert any(rel.startswith("fxgraph/") for rel in out["inductor"])
    assert any(rel.endswith(".so") for rel in out["inductor"])
    assert sorted(rel.rsplit(".", 1)[-1] for rel in out["pch"]) == ["gch", "h"]
    assert out["memo"] == out["triton"] == out["nv"] == []
    assert not any(is_junk(rel) for rels in out.values() for rel in rels)
    # Everything the process wrote lies in a root: the lock folders were there and were skipped.
    assert (tmp_path / "cache" / "locks").is_dir()
    written = {str(p) for p in tmp_path.rglob("*") if p.is_file() and not is_junk(str(p.relative_to(tmp_path)))}
    walked = {os.path.join(resolve_root_in(env, role), rel) for role, rels in out.items() for rel in rels}
    assert written == walked


def resolve_root_in(env: dict, role: str) -> str:
    tmp, home = env["TMPDIR"], env["HOME"]
    return {"inductor": env["TORCHINDUCTOR_CACHE_DIR"],
            "pch": f"{tmp}/torchinductor_{env['USER']}/precompiled_headers",
            "memo": f"{tmp}/torchinductor_{env['USER']}/cache",
            "triton": f"{home}/.triton/cache", "nv": f"{home}/.nv/ComputeCache"}[role]
