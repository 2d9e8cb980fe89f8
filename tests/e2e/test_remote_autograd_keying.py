"""Publishing from a process with PyTorch's remote AOTAutograd cache on: the publish warns, and the
warning is true.

torch keys AOTAutograd entries by the whole functorch config, whose ``enable_remote_autograd_cache``
(``TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1``) is part of it; FX graph keys leave the remote switches out.
So a version published from such a process gives a process without the setting an FX graph hit but an
AOTAutograd miss (it traces the joint graph again). The test pins that behaviour of torch: when a
release stops keying by the switch, the first restore here hits AOTAutograd, this test fails, and
``cachesvc_client.publish.keying.keying_warnings`` should go. No Redis is needed: the key holds the setting
whether or not a remote cache can be reached.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from harness.containers import Container
from harness.service import ServiceProcess

pytestmark = pytest.mark.slow

REMOTE_AUTOGRAD = {"TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1"}


def test_a_version_published_with_the_remote_autograd_cache_on_warns_and_misses_aot_autograd(tmp_path):
    with ServiceProcess(tmp_path / "svc") as svc:
        a = Container(tmp_path, "a").run_worker("--model", "mlp", "--publish", **REMOTE_AUTOGRAD, **svc.client_env())
        assert a["counters"].get("fxgraph_cache_miss", 0) >= 1, a["counters"]
        warnings = a["publish"]["warnings"]
        assert len(warnings) == 1 and "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1" in warnings[0], a["publish"]

        # B restores A's version without the setting: FX graph hits, AOTAutograd misses. It publishes
        # what it adds (merged with A's version), with no warning.
        b = Container(tmp_path, "b").run_worker("--model", "mlp", "--restore", "--publish", **svc.client_env())
        assert b["restore"]["hit"], b["restore"]
        assert b["counters"].get("fxgraph_cache_hit", 0) >= 1 and b["counters"].get("fxgraph_cache_miss", 0) == 0, \
            b["counters"]
        assert b["counters"].get("autograd_cache_miss", 0) >= 1 and b["counters"].get("autograd_cache_hit", 0) == 0, \
            b["counters"]
        assert b["publish"]["warnings"] == [] and b["publish"]["status"] == "committed", b["publish"]

        # C, set up like B, restores the merged version: everything hits.
        c = Container(tmp_path, "c").run_worker("--model", "mlp", "--restore", **svc.client_env())
        assert c["counters"].get("fxgraph_cache_hit", 0) >= 1 and c["counters"].get("autograd_cache_hit", 0) >= 1, \
            c["counters"]
        assert c["counters"].get("fxgraph_cache_miss", 0) == 0 and c["counters"].get("autograd_cache_miss", 0) == 0, \
            c["counters"]


KEYS = """
import os, sys, torch
with torch.no_grad():
    torch.compile(lambda x: (x * 2).relu())(torch.randn(4, 8))
cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
print(sorted(os.listdir(os.path.join(cache, "aotautograd"))), sorted(os.listdir(os.path.join(cache, "fxgraph"))))
"""


def test_ci_in_the_environment_keys_aot_autograd_apart_and_not_the_fx_graph(tmp_path):
    """torch 2.13 reads $CI into functorch's config (error_on_custom_op_aliasing's default), which it puts in
    AOTAutograd keys and not in FX graph keys: a build job on a CI runner publishes entries a fleet without
    CI half-misses (the CI runs of tests/e2e/test_torch_restart.py did, twice, before the suite took CI out
    of its processes: tests/conftest.py). ``keying_warnings`` warns of it while this holds; when a torch
    release stops keying by CI, this fails and the warning should go."""
    keys = {}
    for ci in ("", "true"):
        ctr = Container(tmp_path, f"ci-{ci or 'unset'}")
        env = ctr.env(**({"CI": ci} if ci else {}))
        out = subprocess.run([sys.executable, "-c", KEYS], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        keys[ci] = out.stdout.strip().splitlines()[-1]
    aot = {ci: k.split("] [")[0] for ci, k in keys.items()}
    fx = {ci: k.split("] [")[1] for ci, k in keys.items()}
    assert fx[""] == fx["true"], keys
    assert aot[""] != aot["true"], keys
