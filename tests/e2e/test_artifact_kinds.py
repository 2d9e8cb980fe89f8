"""End to end with real torch.compile on the CPU: the artifact kinds other than the snapshot.

For each kind the installed torch supports (skipped with the reason
otherwise) a cold container compiles and publishes it through a real
``cachesvc serve`` process; a restarted container (same paths, empty HOME,
TMPDIR and cache dir) restores it and runs the model:

* ``mega-cache``: restore loads the blob with load_cache_artifacts, then
  torch.compile finds every FX graph in Inductor's cache (hits, no miss);
* ``aot-function`` and ``pt2-package``: restore fetches the precompiled file
  and ``load_precompiled`` loads it: Dynamo never runs (no frame, no graph
  counted) and the result equals eager's.
Speed is measured in bench/ttfi.py, not asserted here.
"""
from __future__ import annotations

import pytest

from cachesvc_client.process import torch_support
from harness.containers import Container
from harness.service import ServiceProcess

pytestmark = pytest.mark.slow

MODEL = "mlp"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with ServiceProcess(tmp_path_factory.mktemp("artifact-kinds") / "svc") as svc:
        yield svc


def round_trip(tmp_path, service, kind: str):
    why = torch_support.support(kind)
    if why:
        pytest.skip(why)
    ctr = Container(tmp_path / "containers")
    cold = ctr.run_worker("--model", MODEL, "--kind", kind, "--publish", **service.client_env())
    published = cold["publish"]
    assert published["status"] == "committed" and published["kind"] == kind and published["files"] == 1, published
    ctr.restart()
    warm = ctr.run_worker("--model", MODEL, "--kind", kind, "--restore", **service.client_env())
    report = warm["restore"]
    assert report["hit"] and report["kind"] == kind and report["version_id"] == published["version_id"], report
    assert warm["max_abs_diff"] < 1e-4
    print(f"{kind}: cold first call {cold['first_call_s']:.2f} s; restored: restore {warm['restore_s']:.2f} s "
          f"+ first call {warm['first_call_s']:.2f} s")
    return cold, warm


def test_mega_cache_restore_loads_the_blob_and_inductor_hits_every_graph(tmp_path, service):
    cold, warm = round_trip(tmp_path, service, "mega-cache")
    assert cold["counters"].get("fxgraph_cache_miss", 0) >= 1
    loaded = warm["restore"]["loaded"]
    assert loaded.get("inductor", 0) >= 1, loaded
    assert warm["counters"].get("fxgraph_cache_hit", 0) >= 1, warm["counters"]
    assert warm["counters"].get("fxgraph_cache_miss", 0) == 0, warm["counters"]


@pytest.mark.parametrize("kind", ["aot-function", "pt2-package"])
def test_precompiled_artifact_runs_without_dynamo_in_the_restored_container(tmp_path, service, kind):
    cold, warm = round_trip(tmp_path, service, kind)
    assert cold["precompiled"] == "compiled" and warm["precompiled"] == "loaded"
    meta = warm["restore"]["meta"]
    import torch

    assert meta["torch"] == torch.__version__ and meta["device"] == "cpu"
    assert meta["signature"].endswith("f32[8,256]"), meta
    stats = warm["counters_all"].get("stats", {})
    assert stats.get("unique_graphs", 0) == 0 and stats.get("calls_captured", 0) == 0, warm["counters_all"]
    assert "frames" not in warm["counters_all"], warm["counters_all"]
