"""Serving engines' compile caches travel at their own layout (docs/integrations.md).

vLLM: the vllm and vllm_aot roots publish its compile cache under VLLM_CACHE_ROOT, and a restore
brings it back under the restoring container's own VLLM_CACHE_ROOT. SGLang: with SGLANG_CACHE_DIR
inside TORCHINDUCTOR_CACHE_DIR its tree travels with the inductor root. The layouts are the
engines' own, from their sources (vllm/compilation/backends.py, compiler_interface.py, caching.py;
sglang/srt/compilation/backend.py, compiler_interface.py); neither installs here."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cachesvc_client.process.roots import default_roots, resolve_root
from tests.deploy.processes import SQLITE_LOCAL, base_env
from tests.helpers import ENV

HASH = "3f2a9c41d0"  # VllmBackend: hash_factors(all_factors)[:10]
AOT_HASH = "5e" * 32  # the AOT path: sha256 of aot_compile_hash_factors + the model's forward

#: relpath under VLLM_CACHE_ROOT -> bytes: what one `vllm serve` with torch.compile leaves there.
VLLM_FILES = {
    # VllmBackend.__call__: <root>/torch_compile_cache/<hash>/rank_<rank>_<dp_rank>/<prefix>/
    f"torch_compile_cache/{HASH}/rank_0_0/backbone/cache_key_factors.json": b'{"env": {}, "config": {}}',
    f"torch_compile_cache/{HASH}/rank_0_0/backbone/computation_graph.py": b"import torch\nclass GraphModule: ...\n",
    # CompilerManager.save_to_file: the handles, pretty-printed (their paths are absolute: see docs)
    f"torch_compile_cache/{HASH}/rank_0_0/backbone/vllm_compile_cache.py":
        b"{((1, 8192), 'a1b2', 'inductor_standalone'): ('artifact_compile_range_1_8192_subgraph_0', '/x')}\n",
    # InductorStandaloneAdaptor.compile: CompiledArtifact.save(path=<local_cache_dir>/<key>, format="binary")
    f"torch_compile_cache/{HASH}/rank_0_0/backbone/artifact_compile_range_1_8192_subgraph_0": b"\x00artifact" * 64,
    # InductorAdaptor.initialize_cache: TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR under the rank dir
    f"torch_compile_cache/{HASH}/rank_0_0/inductor_cache/fxgraph/kx/fkx7/0": b"fx graph entry",
    f"torch_compile_cache/{HASH}/rank_0_0/inductor_cache/kx/ckx7.py": b"# triton kernel source\n",
    f"torch_compile_cache/{HASH}/rank_0_0/triton_cache/QWERTY/triton_poi_fused_0.cubin": b"\x7fcubin",
    # The AOT path (current releases): ...torch_compile_cache/torch_aot_compile/<hash>/{inductor_cache,rank_i_j/model}
    f"torch_compile_cache/torch_aot_compile/{AOT_HASH}/rank_0_0/model": b"serialized AOT function",
    f"torch_compile_cache/torch_aot_compile/{AOT_HASH}/inductor_cache/fxgraph/zz/fzz1/0": b"aot fx graph",
    # The AOT path of older releases: <root>/torch_aot_compile/<hash>/rank_i_j/model
    f"torch_aot_compile/{AOT_HASH}/rank_1_0/model": b"older serialized AOT function",
}
#: What must not travel: Inductor's locks and an interrupted atomic write inside vLLM's tree, and
#: what else vLLM keeps in its cache root (not compile state).
JUNK = [f"torch_compile_cache/{HASH}/rank_0_0/inductor_cache/locks/fkx7.lock",
        f"torch_compile_cache/{HASH}/rank_0_0/inductor_cache/kx/.ckx7.py.12.34.tmp"]
NOT_COMPILE_STATE = ["modelinfos/Qwen3ForCausalLM.json"]

SGLANG_HASH = "9d1c7be402"  # SGLangBackend: InductorAdaptor.compute_hash(), md5(...)[:10]
#: relpath under SGLANG_CACHE_DIR -> bytes: the piecewise CUDA graph backend's tree. Its
#: InductorAdaptor points TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR under the model's dir.
SGLANG_FILES = {
    f"torch_compile_cache/{SGLANG_HASH}/rank_0_0/backbone/sglang_compile_cache.py": b"{(None, 0, 'inductor'): ('h', '/p')}",
    f"torch_compile_cache/{SGLANG_HASH}/rank_0_0/backbone/computation_graph.py": b"import torch\n",
    f"torch_compile_cache/{SGLANG_HASH}/rank_0_0/backbone/inductor_cache/fxgraph/pq/fpq2/0": b"fx graph entry",
    f"torch_compile_cache/{SGLANG_HASH}/rank_0_0/backbone/triton_cache/ASDF/triton_red_fused_1.cubin": b"\x7fcubin",
}

#: Lays out LAYOUT (relpath -> hex) under LAYOUT_ROOT, then publishes this container's roots.
PUBLISH = """
    import json, os, pathlib, sys
    from cachesvc_client import CacheClient
    root = pathlib.Path(os.environ["LAYOUT_ROOT"])
    for rel, data in json.loads(os.environ["LAYOUT"]).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(bytes.fromhex(data))
    report = CacheClient(os.environ["CACHESVC_URL"], os.environ["CACHESVC_TOKEN"]).publish(
        os.environ["MODEL"], "serve:max_num_seqs=256", env=json.loads(os.environ["KEY_ENV"]))
    print(json.dumps({"status": report.status, "roots": report.roots, "files": report.files}))
"""
RESTORE = """
    import json, os
    from cachesvc_client import CacheClient
    report = CacheClient(os.environ["CACHESVC_URL"], os.environ["CACHESVC_TOKEN"]).restore(
        os.environ["MODEL"], "serve:max_num_seqs=256", env=json.loads(os.environ["KEY_ENV"]), strict=True)
    print(json.dumps({"hit": report.hit, "files": report.files, "failed": report.failed, "roots": report.roots}))
"""


def container(base: Path, **extra: str) -> dict:
    """A fresh container's environment: its own HOME, TMPDIR and Inductor cache dir, nothing inherited."""
    (base / "inductor").mkdir(parents=True, exist_ok=True)
    return base_env(base, TORCHINDUCTOR_CACHE_DIR=str(base / "inductor"), KEY_ENV=json.dumps(ENV), **extra)


def layout(files: dict) -> str:
    return json.dumps({k: v.hex() for k, v in files.items()})


def run(code: str, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_vllm_roots_follow_vllm_cache_root_then_xdg_cache_home_then_home(tmp_path, monkeypatch):
    for var in ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_root("vllm") == str(tmp_path / "home/.cache/vllm/torch_compile_cache")
    assert resolve_root("vllm_aot") == str(tmp_path / "home/.cache/vllm/torch_aot_compile")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_root("vllm") == str(tmp_path / "xdg/vllm/torch_compile_cache")
    monkeypatch.setenv("VLLM_CACHE_ROOT", "~/models/vllm")  # vLLM expands the user
    assert resolve_root("vllm") == str(tmp_path / "home/models/vllm/torch_compile_cache")
    roots = {r.role: r for r in default_roots(str(tmp_path / "inductor"))}
    assert roots["vllm"].path == str(tmp_path / "home/models/vllm/torch_compile_cache")
    assert roots["vllm_aot"].path == str(tmp_path / "home/models/vllm/torch_aot_compile")


def test_an_inductor_cache_dir_inside_vllms_tree_is_published_once(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    inside = tmp_path / "vllm/torch_compile_cache" / HASH / "rank_0_0/inductor_cache"
    roots = {r.role: r for r in default_roots(str(inside))}
    assert roots["vllm"].exclude == (str(inside),)  # walked as the inductor root, not twice


@SQLITE_LOCAL
def test_vllm_compile_cache_comes_back_at_its_layout_under_the_new_containers_vllm_cache_root(
        live_server, tokens, tmp_path):
    a_root = tmp_path / "a" / "vllm-cache"
    files = {**VLLM_FILES, **{rel: b"junk" for rel in JUNK + NOT_COMPILE_STATE}}
    a = container(tmp_path / "a", VLLM_CACHE_ROOT=str(a_root), CACHESVC_URL=live_server.url,
                  CACHESVC_TOKEN=tokens["write"], LAYOUT_ROOT=str(a_root), LAYOUT=layout(files), MODEL="qwen3-8b")
    published = run(PUBLISH, a)
    assert published["status"] == "committed" and published["files"] == len(VLLM_FILES)
    assert published["roots"]["vllm"] == str(a_root / "torch_compile_cache")
    assert published["roots"]["vllm_aot"] == str(a_root / "torch_aot_compile")

    # The fresh container sets no VLLM_CACHE_ROOT: vLLM's default under its own HOME.
    b = container(tmp_path / "b", CACHESVC_URL=live_server.url, CACHESVC_TOKEN=tokens["read"], MODEL="qwen3-8b")
    restored = run(RESTORE, b)
    assert restored["hit"] and not restored["failed"] and restored["files"] == len(VLLM_FILES)
    b_root = tmp_path / "b" / "home" / ".cache" / "vllm"
    assert restored["roots"]["vllm"] == str(b_root / "torch_compile_cache")
    for rel, data in VLLM_FILES.items():
        assert (b_root / rel).read_bytes() == data, rel
    for rel in JUNK + NOT_COMPILE_STATE:
        assert not (b_root / rel).exists(), rel


@SQLITE_LOCAL
def test_sglang_compile_cache_travels_inside_the_inductor_root(live_server, tokens, tmp_path):
    """docs/integrations.md: SGLANG_CACHE_DIR=$TORCHINDUCTOR_CACHE_DIR/sglang, no role of its own."""
    a = container(tmp_path / "a", CACHESVC_URL=live_server.url, CACHESVC_TOKEN=tokens["write"], MODEL="llama-3-8b")
    a.update(SGLANG_CACHE_DIR=f"{a['TORCHINDUCTOR_CACHE_DIR']}/sglang", LAYOUT_ROOT=f"{a['TORCHINDUCTOR_CACHE_DIR']}/sglang",
             LAYOUT=layout(SGLANG_FILES))
    published = run(PUBLISH, a)
    assert published["status"] == "committed" and published["files"] == len(SGLANG_FILES)
    b = container(tmp_path / "b", CACHESVC_URL=live_server.url, CACHESVC_TOKEN=tokens["read"], MODEL="llama-3-8b")
    restored = run(RESTORE, b)
    assert restored["hit"] and not restored["failed"]
    for rel, data in SGLANG_FILES.items():
        assert (Path(b["TORCHINDUCTOR_CACHE_DIR"]) / "sglang" / rel).read_bytes() == data, rel
