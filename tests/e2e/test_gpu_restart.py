"""The restart flow on a CUDA GPU: Triton kernels, CUDA graphs, autotuning results, ranks.

Skipped without a GPU (CI has none); run on the H200 through the device tool
(docs/gpu.md says how). Each case: a cold container compiles and publishes; the same
container again is the floor; a restarted container (same paths, empty HOME,
TMPDIR, cache dir) restores and must hit with no compile artifact of its own:
no Triton kernel, launcher or autotune result is rebuilt. A relocated restore
(another cache-dir path) is measured too. Timings go to $CACHESVC_GPU_RESULTS
(JSON lines) when set.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.containers import Container
from harness.service import ServiceProcess

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run it on the device)")]

CASES = [("resnet50", "default"), ("resnet50", "reduce-overhead"),
         ("encoder6", "default"), ("encoder6", "reduce-overhead"), ("encoder6", "max-autotune-no-cudagraphs")]




def record(**row) -> None:
    path = os.environ.get("CACHESVC_GPU_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
    print(json.dumps(row))


def manifest(service, version_id: int) -> set:
    """The files a version holds, as ``role:relpath`` (what ``Container.artifacts`` lists)."""
    import requests

    r = requests.get(f"{service.url}/api/v1/versions/{version_id}", timeout=30,
                     headers={"Authorization": f"Bearer {service.token}"} if service.token else {})
    r.raise_for_status()
    return {f"{f['root']}:{f['path']}" for f in r.json()["files"]}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with ServiceProcess(tmp_path_factory.mktemp("gpu-service")) as svc:
        yield svc


@pytest.mark.parametrize("model,mode", CASES, ids=[f"{m}-{o}" for m, o in CASES])
def test_gpu_restart_restores_kernels_and_autotuning(service, tmp_path, model, mode):
    args = ("--model", model, "--mode", mode, "--device", "cuda")
    env = service.client_env()
    ctr = Container(tmp_path / "host")
    cold = ctr.run_worker(*args, "--publish", **env)
    assert cold["publish"]["status"] == "committed"
    published = ctr.artifacts()
    # What the cold process published, as against what its container holds: a binary the compiling
    # process had but left out (Triton's driver helper: client/process/driver_helpers.py) is built again after a restore.
    manifested = manifest(service, cold["publish"]["version_id"])
    floor = ctr.run_worker(*args)
    assert floor["counters"].get("fxgraph_cache_hit", 0) >= 1

    ctr.restart()
    warm = ctr.run_worker(*args, "--restore", **env)
    rep = warm["restore"]
    assert rep["hit"] and not rep["failed"], rep
    assert warm["counters"].get("fxgraph_cache_hit", 0) >= 1, warm["counters"]
    assert warm["counters"].get("fxgraph_cache_miss", 0) == 0, warm["counters"]
    after = ctr.artifacts()
    new = sorted(after - published)
    rebuilt = sorted(f for f in after - manifested if f.endswith((".so", ".cubin", ".ptx", ".hsaco")))

    moved = Container(tmp_path / "elsewhere", name="relocated-host")  # another absolute path
    reloc = moved.run_worker(*args, "--restore", **env)
    assert reloc["counters"].get("fxgraph_cache_hit", 0) >= 1, reloc["counters"]
    reloc_new = sorted(moved.artifacts() - published)

    record(model=model, mode=mode, device=torch.cuda.get_device_name(0), torch=torch.__version__,
           cold_s=cold["first_call_s"], floor_s=floor["first_call_s"], restore_s=warm["restore_s"],
           restored_first_call_s=warm["first_call_s"], relocated_restore_s=reloc["restore_s"],
           relocated_first_call_s=reloc["first_call_s"], files=rep["files"], bytes=rep["bytes_written"],
           transferred=rep["bytes"], roots=sorted(rep["roots"]), new_files_after_restore=new,
           new_files_after_relocated_restore=reloc_new, binaries_not_published=rebuilt,
           counters=warm["counters_all"].get("inductor", {}),
           torch_fixes=warm.get("torch_fixes"))
    assert not new, f"the restored process compiled artifacts of its own: {new}"
    assert not rebuilt, f"the restored process built binaries the compiling process did not publish: {rebuilt}"
    assert not reloc_new, f"the relocated restore compiled artifacts of its own: {reloc_new}"


def test_ranks_on_one_gpu_restore_once_and_all_hit(service, tmp_path):
    args = ("--model", "encoder6", "--mode", "default", "--device", "cuda", "--name", "encoder6-ranks")
    env = service.client_env()
    ctr = Container(tmp_path / "host")
    ctr.run_worker(*args, "--publish", **env)
    ctr.restart()
    cmd = [sys.executable, str(Path(__file__).resolve().parents[2] / "harness" / "worker.py"), *args, "--restore"]
    procs = [subprocess.Popen(cmd, env=ctr.env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(next(l for l in out.splitlines() if l.startswith("RESULT "))[7:]))
    assert all(r["counters"].get("fxgraph_cache_hit", 0) >= 1 and not r["counters"].get("fxgraph_cache_miss")
               for r in results), [r["counters"] for r in results]
    written = [r["restore"]["files"] for r in results]
    assert sum(written) == max(written) and sum(1 for w in written if w) == 1, written
    record(model="encoder6", mode="ranks-4", restore_files_per_rank=written,
           first_call_s=[r["first_call_s"] for r in results])
