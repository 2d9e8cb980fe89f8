"""Two processes share compile work through the live remote cache, with no restart and no restore.

Process A (a fresh container) compiles the mlp with ``--remote-cache`` and stays alive. Process B,
another fresh container (own HOME, TMPDIR and cache dir: nothing on disk from A) started while A
runs, compiles the same model and shape: Inductor finds A's FX graph and AOTAutograd entry in
cachesvc (``fxgraph_cache_hit``, ``autograd_cache_hit``, and Inductor's own remote counters
``cache_stats["RemoteFxGraphCache"]``; torch 2.13 has no remote counter in ``counters["inductor"]``).
Process C, like B but with another environment fingerprint (``CACHESVC_ENV_TORCH``), must miss:
items are namespaced by the fingerprint, whatever Inductor's own keys hold.
On the CPU a remote FX-graph hit still builds the kernels' .so and the precompiled header in the
new container; bench/ttfi.py measures what is left (docs/benchmarks.md).
"""
from __future__ import annotations

import pytest

from harness.containers import Container
from harness.service import ServiceProcess

pytestmark = pytest.mark.slow


def remote_stats(result: dict, cache: str) -> dict:
    return result["remote_cache"]["stats"][cache]


def test_a_second_process_gets_the_first_ones_compile_from_the_remote_cache(tmp_path):
    with ServiceProcess(tmp_path / "svc") as svc:
        a = Container(tmp_path, "a").start_worker("--model", "mlp", "--remote-cache", **svc.client_env())
        try:
            first = Container.read_result(a)
            assert first["remote_cache"]["enabled"] == ["aot-autograd", "autotune", "fx-graph"], first
            assert first["counters"].get("fxgraph_cache_miss", 0) >= 1, first["counters"]
            assert remote_stats(first, "fx-graph")["puts"] >= 1 and remote_stats(first, "aot-autograd")["puts"] >= 1
            assert a.poll() is None, "A stays alive while B compiles"

            other = Container(tmp_path, "c").start_worker("--model", "mlp", "--remote-cache",
                                                          CACHESVC_ENV_TORCH="9.9.9", **svc.client_env())
            second = Container(tmp_path, "b").run_worker("--model", "mlp", "--remote-cache", **svc.client_env())
            third = Container.read_result(other)
            assert Container.stop_worker(other) == 0
        finally:
            assert Container.stop_worker(a) == 0

    counters = second["counters"]
    assert counters.get("fxgraph_cache_hit", 0) >= 1 and counters.get("fxgraph_cache_miss", 0) == 0, counters
    assert counters.get("autograd_cache_hit", 0) >= 1 and counters.get("autograd_cache_miss", 0) == 0, counters
    assert remote_stats(second, "fx-graph")["hits"] >= 1 and remote_stats(second, "fx-graph")["errors"] == 0
    assert second["remote_cache"]["inductor"]["RemoteFxGraphCache"]["hit"] >= 1
    assert second["remote_cache"]["inductor"]["RemoteAOTAutogradCache"]["hit"] >= 1

    assert third["counters"].get("fxgraph_cache_hit", 0) == 0, third["counters"]
    assert remote_stats(third, "fx-graph") == {"hits": 0, "misses": 1, "puts": 1, "errors": 0, "skipped": 0,
                                              "rejected": 0}
