"""End to end with real torch.compile on the CPU: a fallback restore of another shape, and what verify says.

Process A compiles the mlp at batch 8 and publishes it. Process B, in a
fresh container, wants batch 4: no entry has that key, so its restore takes
the ``shape`` fallback (A's version), labelled as such, with the differing
field named. B then compiles: its own counters show FX-graph and AOTAutograd
misses (another shape is another graph), so ``client.verify()`` says
``no_hits`` for a fallback and reports it, which counts but marks no
problem; the precompiled header A built is reused (B writes none), which is
what the fallback bought. B publishes with merge: the new key holds A's
files and B's. Process C restores A's key exactly but compiles with another
Inductor config (part of every cache key): every graph misses, its verify
says ``no_hits`` for an exact restore, and the service lists the entry as a
problem.
"""
from __future__ import annotations

import pytest
import requests

from harness.containers import Container
from harness.service import ServiceProcess

pytestmark = pytest.mark.slow


def test_fallback_restore_of_another_shape_and_the_verdicts(tmp_path):
    with ServiceProcess(tmp_path / "svc") as svc:
        a = Container(tmp_path / "containers", "a")
        cold = a.run_worker("--model", "mlp", "--name", "mlp", "--publish", **svc.client_env())
        assert cold["publish"]["status"] == "committed", cold["publish"]
        published = cold["publish"]["files"]

        b = Container(tmp_path / "containers", "b")
        warm = b.run_worker("--model", "mlp-b4", "--name", "mlp", "--restore", "--fallback", "shape", "--verify",
                            "--publish", **svc.client_env())
        report, verdict = warm["restore"], warm["verify"]
        assert report["hit"] and report["fallback"] == "shape", report
        assert report["files"] == published and report["versions"] == [cold["publish"]["version_id"]]
        assert report["fallback_entries"][0]["differs"] == [
            {"field": "shape", "wanted": "f32[4,256]", "have": "f32[8,256]"}]
        assert warm["counters"].get("fxgraph_cache_miss", 0) >= 1, warm["counters"]
        assert verdict["fallback"] == "shape" and verdict["reported"], verdict
        assert verdict["fxgraph_misses"] == warm["counters"]["fxgraph_cache_miss"]
        assert verdict["fxgraph_hits"] == warm["counters"].get("fxgraph_cache_hit", 0)
        assert verdict["verdict"] in ("no_hits", "partial"), verdict
        assert verdict["new_files"].get("pch", 0) == 0, "the precompiled header came with the fallback"
        assert verdict["cpp_builds"] >= 1, verdict  # batch 4 kernels are new C++ kernels
        # merge on publish: the new key holds what B restored and what it compiled
        assert warm["publish"]["status"] == "committed" and warm["publish"]["files"] > published

        c = Container(tmp_path / "containers", "c")
        other = c.run_worker("--model", "mlp", "--name", "mlp", "--restore", "--verify",
                             TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE="1", **svc.client_env())
        assert other["restore"]["hit"] and not other["restore"]["fallback"]
        assert other["verify"]["verdict"] == "no_hits" and other["verify"]["reported"], other["verify"]

        listing = requests.get(f"{svc.url}/api/v1/entries", params={"problem": "true"}, timeout=10,
                               headers={"Authorization": f"Bearer {svc.token}"}).json()
        assert [(e["shape"], e["problem"]) for e in listing["entries"]] == [("f32[8,256]", True)]
        stats = requests.get(f"{svc.url}/api/v1/stats", timeout=10,
                             headers={"Authorization": f"Bearer {svc.token}"}).json()
        assert stats["fallbacks"] == 1
        print(f"cold {cold['first_call_s']:.2f} s; fallback restore {warm['restore_s']:.2f} s + first call "
              f"{warm['first_call_s']:.2f} s ({verdict['verdict']}: FX {verdict['fxgraph_hits']} hit(s) "
              f"{verdict['fxgraph_misses']} miss(es), {verdict['cpp_builds']} C++ kernel(s) built); "
              f"exact restore, other config: first call {other['first_call_s']:.2f} s ({other['verify']['verdict']})")
