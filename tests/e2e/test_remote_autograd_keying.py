"""Publishing from a process with PyTorch's remote AOTAutograd cache on: the publish warns, and the
warning is true.

torch keys AOTAutograd entries by the whole functorch config, whose ``enable_remote_autograd_cache``
(``TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1``) is part of it; FX graph keys leave the remote switches out.
So a version published from such a process gives a process without the setting an FX graph hit but an
AOTAutograd miss (it traces the joint graph again). The test pins that behaviour of torch: when a
release stops keying by the switch, the first restore here hits AOTAutograd, this test fails, and
``cachesvc_client.publish.snapshot.keying_warnings`` should go. No Redis is needed: the key holds the setting
whether or not a remote cache can be reached.
"""
from __future__ import annotations

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
