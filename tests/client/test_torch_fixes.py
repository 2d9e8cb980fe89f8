"""client/process/torch_fixes.py: cached coordinate-descent winners keep their mark on load.

The GPU proof is tests/e2e/test_gpu_restart.py's max-autotune case (no kernel
tuned or compiled again after a restore). Here: the replacement
method's decisions, on a stand-in for the few names of torch's module it uses,
and that the installed torch is left alone when it already has the fix.
"""
from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from cachesvc_client.process import torch_fixes


class Config:
    def __init__(self, **kw):
        self.kwargs = kw

    def __repr__(self):
        return f"Config({self.kwargs})"


class Result:
    def __init__(self, config):
        self.config = config


def fake_th(cached):
    compiled = []
    th = types.SimpleNamespace(
        check_autotune_cache=lambda configs, filename, meta: (cached if cached else configs, None, {"state": "x"}),
        triton_config_to_hashable=lambda c: tuple(sorted(c.kwargs.items())),
    )
    return th, compiled


def tuner(configs, compiled):
    t = types.SimpleNamespace(compile_results=[Result(c) for c in configs], filename="k.py", inductor_meta={},
                              fn=types.SimpleNamespace(fn=object()))
    t._precompile_config = lambda cfg: compiled.append(cfg) or Result(cfg)
    return t


def coordesc(**kw):
    c = Config(**kw)
    c.found_by_coordesc = True
    return c


def test_winner_among_compiled_configs_keeps_its_coordesc_mark():
    th, compiled = fake_th([coordesc(XBLOCK=512)])
    t = tuner([Config(XBLOCK=1024), Config(XBLOCK=512)], compiled)
    torch_fixes._recheck_autotune_cache(th)(t, reload_kernel_from_src=None)
    assert [r.config.kwargs for r in t.compile_results] == [{"XBLOCK": 512}]
    assert t.compile_results[0].config.found_by_coordesc is True  # torch 2.11 dropped this: run() tuned again
    assert compiled == []


def test_single_config_kernel_gets_its_cached_winner():
    """torch 2.11 skipped kernels compiled with one config; their coordesc winner must be used too."""
    th, compiled = fake_th([coordesc(XBLOCK=4)])
    t = tuner([Config(XBLOCK=1)], compiled)
    torch_fixes._recheck_autotune_cache(th)(t, reload_kernel_from_src=None)
    assert [c.kwargs for c in compiled] == [{"XBLOCK": 4}]
    assert t.compile_results[0].config.found_by_coordesc is True


def test_no_cached_winner_leaves_the_configs():
    th, compiled = fake_th([])
    configs = [Config(XBLOCK=1024), Config(XBLOCK=512)]
    t = tuner(configs, compiled)
    torch_fixes._recheck_autotune_cache(th)(t, reload_kernel_from_src=None)
    assert [r.config for r in t.compile_results] == configs and compiled == []


def test_installed_torch_is_left_alone_when_it_keeps_the_mark():
    """In a fresh process: the patch waits for Inductor's import, then acts by what the code does."""
    pytest.importorskip("torch")
    code = """if 1:
        import inspect, json, sys
        from cachesvc_client import apply_torch_fixes
        waiting = apply_torch_fixes()["coordesc-mark"]
        assert "torch._inductor.runtime.triton_heuristics" not in sys.modules
        from torch._inductor.runtime import triton_heuristics as th
        method = th.CachingAutotuner.recheck_autotune_cache
        print(json.dumps({"waiting": waiting, "state": apply_torch_fixes()["coordesc-mark"],
                          "patched": getattr(method, "_cachesvc_fix", False),
                          "has_mark": "found_by_coordesc = found_by_coordesc" in inspect.getsource(method)}))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["waiting"].startswith("on import of")
    if r["patched"]:  # an older torch: the fix is installed, and it carries the mark
        assert r["state"] == "applied" and r["has_mark"]
    else:
        assert r["state"].startswith("not needed") and r["has_mark"]


def test_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("CACHESVC_TORCH_FIXES", "0")
    assert "disabled" in torch_fixes.apply()["coordesc-mark"]
