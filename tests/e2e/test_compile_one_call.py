"""End to end with real torch.compile on the CPU: ``cachesvc_client.compile``, the one call (issue 18).

A cold container compiles through the one call and publishes (the snapshot
and a weightless AOTInductor package, built and checked in the background);
a restarted container (same paths, empty HOME, TMPDIR and cache dir) gets
the package and its proof (Dynamo's guards of the build's trace, checked
against the live model: proof.py) and reaches its first output without
tracing or compiling anything (no Dynamo frame, no Inductor compiler, no
Triton), on its own weights (scaled after publish: the package carries none). The fallbacks:
another input shape at call time, a model whose structure changed after
publish, another torch (the key's env): each compiles with torch.compile and
equals eager. Speed is measured in bench/ttfi.py, not asserted here.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from cachesvc_client.one_call import support
from harness.containers import Container
from harness.service import ServiceProcess

pytestmark = pytest.mark.slow
TOL = 1e-4


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A service and a container that compiled the mlp through the one call and published it."""
    import torch  # noqa: F401 - support reads torch's API

    why = support.support()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("one-call")
    with ServiceProcess(base / "svc") as svc:
        ctr = Container(base / "containers")
        cold = ctr.run_worker("--model", "mlp", "--one-call", "--publish", **svc.client_env())
        ctr.restart()
        yield svc, ctr, cold


def run(ctr, svc, *flags, **env):
    return ctr.run_worker(*flags, "--one-call", **svc.client_env(), **env)


def test_a_miss_compiles_and_publishes_the_snapshot_and_the_package(published):
    _, _, cold = published
    assert cold["compile"]["source"] == "compiled" and cold["compile"]["route"] == "aoti", cold["compile"]
    assert cold["max_abs_diff"] < TOL
    snapshot, artifact = cold["publish"]["snapshot"], cold["publish"]["artifact"]
    assert cold["publish"]["done"] and snapshot["status"] == "committed", cold["publish"]
    assert artifact["status"] == "committed" and artifact["kind"] == "pt2-package", artifact
    # the report says where the build's seconds went: the child's whole build inside build_s
    assert 0 < artifact["build_phases"]["package"] < artifact["build_s"] and artifact["check_s"] > 0, artifact


def test_a_restarted_container_loads_it_without_tracing_or_compiling(published):
    svc, ctr, _ = published
    # its own weights (the package has none); then it waits for compile()'s hold on the collector to end
    warm = run(ctr, svc, "--model", "mlp", "--scale-weights", "1.5", "--wait-gc-release", cold=True)
    assert warm["compile"]["source"] == "artifact", warm["compile"]
    assert warm["compile"]["calls"] == {"artifact": 1, "torch.compile": 0}
    # Dynamo's guard code checks the proof; its tracer and Inductor's compiler never run. Triton only where
    # importing Dynamo alone imports it (torch 2.13's CUDA build probes it for its native ops, GPU or not)
    imported = warm["imported"]
    assert imported["torch._dynamo"] and not any(imported[m] for m in ("torch._inductor.compile_fx",
                                                                         "torch._inductor.graph")), imported
    assert not imported["triton"] or dynamo_alone_imports_triton(), imported
    assert "frames" not in warm["counters_all"] and not warm["counters"], warm["counters_all"]
    assert warm["max_abs_diff"] < TOL
    # where compile()'s own seconds went, each phase timed once: what a slow start is read from
    phases = warm["compile"]["phases"]
    # "first_check", "first_run": the first call's checks and run; "deferred": the snapshot restore and the
    # learned packages, started in a thread a second after the first call had its output (the worker waits for it)
    # "gc": the collector's seconds, already inside the phase each collection interrupted
    # "libraries_wait": the first call's wait for the GPU libraries' warm-up (none on a CPU: no "libraries")
    assert set(phases) == {"key", "restore", "proof", "bind", "load", "background", "total", "first_check",
                           "libraries_wait", "first_run", "deferred", "gc"}, phases
    assert all(v >= 0 for v in phases.values()) and phases["restore"] > 0 and phases["load"] > 0, phases
    assert phases["gc"] <= phases["total"] and phases["first_run"] > 0, phases
    # the full collections held from compile() to just after the first output, then let go (process/collector.py,
    # one_call/deferred.py): still held when the first call returned, not a moment longer than a second or so
    held = warm["gc_oldest_threshold"]
    assert held["after_compile"] > 10**6 and held["after_first_call"] > 10**6, held
    assert held["released_after_s"] is not None and held["released_after_s"] < 3, held
    parts = sum(v for k, v in phases.items()
                if k not in ("total", "deferred", "gc", "first_check", "libraries_wait", "first_run"))
    assert parts <= phases["total"] + 0.01 and phases["total"] <= warm["compile"]["load_s"] + parts, phases
    # and the proof's own: Dynamo's imports (this process had none before), then the guard tree over the model
    proof = warm["compile"]["proof_phases"]
    assert {"imports", "sources", "unpickle", "compare", "tree", "check"} == set(proof), proof
    assert proof["imports"] > 0 and proof["tree"] > 0 and sum(proof.values()) <= phases["proof"] + 0.01, (proof, phases)


def dynamo_alone_imports_triton() -> bool:
    probe = "import sys, torch._dynamo; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    return out.stdout.strip() == "True"


def test_another_shape_at_call_time_falls_back_to_torch_compile(published):
    svc, ctr, _ = published
    r = run(ctr, svc, "--model", "mlp", "--also-batch", "4", CACHESVC_GC_HOLD="0")
    assert r["compile"]["source"] == "artifact" and r["compile"]["calls"] == {"artifact": 1, "torch.compile": 1}
    assert r["gc_oldest_threshold"]["after_compile"] == r["gc_oldest_threshold"]["before"]  # the hold turned off
    assert r["also_batch_max_abs_diff"] < TOL and r["counters_all"]["frames"]["ok"] >= 1


@pytest.mark.parametrize("flags, env, why", [
    (("--model", "mlp-wide", "--name", "mlp"), {}, "structure"),      # same name and inputs, another model
    (("--model", "mlp"), {"CACHESVC_ENV_TORCH": "2.0.0"}, "env"),     # another torch: another key
])
def test_a_changed_model_or_torch_misses_and_compiles(published, flags, env, why):
    svc, ctr, _ = published
    r = run(ctr, svc, *flags, **env)
    assert r["compile"]["source"] == "compiled" and r["compile"]["calls"] == {"artifact": 0, "torch.compile": 1}
    assert r["compile"]["miss_reason"], r["compile"]
    assert r["max_abs_diff"] < TOL and r["counters_all"]["frames"]["ok"] >= 1
    # a miss restores its snapshot before the first call: a phase of its own, and nothing was opened
    phases = r["compile"]["phases"]
    assert {"key", "restore", "snapshot", "background", "total", "gc"} == set(phases), phases
    # a miss lets the held full collections go at once: torch.compile's allocations come next
    assert r["gc_oldest_threshold"]["after_compile"] == r["gc_oldest_threshold"]["before"]


# -- the shapes the fleet learned (issue 41) ------------------------------------------------------------

@pytest.fixture(scope="module")
def learned(published):
    """A second package in the mlp's key family: another container compiled the mlp with batch 2 and published
    it (same model, same tags, another shape). A restart of the first container finds it by listing its family."""
    svc, ctr, _ = published
    other = Container(ctr.root.parent, "batch-2").run_worker("--model", "mlp-b2", "--name", "mlp", "--one-call",
                                                             "--publish", **svc.client_env())
    assert other["publish"]["artifact"].get("status") == "committed", other["publish"]
    return other


def test_a_learned_shape_is_served_by_its_own_package(published, learned):
    svc, ctr, _ = published
    r = run(ctr, svc, "--model", "mlp", "--also-batch", "2")
    assert r["compile"]["source"] == "artifact", r["compile"]
    assert r["compile"]["calls"] == {"artifact": 2, "torch.compile": 0}, r["compile"]
    assert r["compile"]["learned"]["packages"] == [{"shape": "f32[2,256]", "calls": 1}], r["compile"]["learned"]
    assert "frames" not in r["counters_all"], r["counters_all"]  # nothing traced, nothing compiled
    assert r["also_batch_max_abs_diff"] < TOL and r["max_abs_diff"] < TOL
    assert r["compile"]["usage"] == {"f32[8,256]": {"package": 1, "compile": 0, "eager": 0},
                                     "f32[2,256]": {"package": 1, "compile": 0, "eager": 0}}


def test_warm_up_runs_every_shape_the_fleet_served_so_no_request_compiles(published, learned):
    """A process served batch 3 through torch.compile and exited (its usage reported at exit); a restart that
    warms up runs the example's shape and the learned package's from packages and compiles batch 3 before
    traffic: its request path then compiles nothing, batch 3 included."""
    svc, ctr, _ = published
    served = run(ctr, svc, "--model", "mlp", "--also-batch", "3")
    assert served["compile"]["usage"]["f32[3,256]"] == {"package": 0, "compile": 1, "eager": 0}
    warm = run(ctr, svc, "--model", "mlp", "--warm-up", "--also-batch", "3")
    shapes = warm["warmed"]["shapes"]
    assert shapes["f32[8,256]"]["served"] == "package" and shapes["f32[2,256]"]["served"] == "package", shapes
    assert shapes["f32[3,256]"]["served"] == "compile", shapes  # from the fleet's demand
    assert warm["counters_all"].get("frames") == warm["frames_after_warm_up"], "a request compiled after warm-up"
    assert warm["compile"]["calls"]["torch.compile"] >= 2  # batch 3 in the warm-up, then the request
    # the warm-up's calls are not the fleet's: usage counts the two requests only
    assert warm["compile"]["usage"] == {"f32[8,256]": {"package": 1, "compile": 0, "eager": 0},
                                        "f32[3,256]": {"package": 0, "compile": 1, "eager": 0}}
    assert warm["also_batch_max_abs_diff"] < TOL
