"""End to end with real torch.compile on the CPU, each process a fresh container, from the wheel.

The restart demo (scripts/demo.sh's demo/restart.py) runs as a user would run it from an installed
cachesvc: its venv has the run's wheel installed by pip (tests/shipped.py: ``cachesvc[server]`` and torch,
not editable), demo/ and harness/ are copied outside the checkout, and nothing of the checkout can be
imported, so a module or data file the wheel lacks fails here. In it a cold container compiles and
publishes to `cachesvc serve` (the embedded default: SQLite + local blobs), the same container runs again
(the floor), and a restarted container (same paths, empty HOME, TMPDIR and cache dir) restores and
compiles: its inductor counters must show FX-graph and AOTAutograd hits and no miss (the demo's own exit
status).

The restored container's snapshot is then published by the installed `cachesvc-client` to a service on
PostgreSQL + S3 (rclone), from the same venv, and a restart restores from there: hits and no miss, and it
must write no compile artifact of its own: every file in its roots afterwards is one the restore brought
(no rebuilt precompiled header, no new .so), which is what separates the floor (~1.7-3.5 s here) from a
cache-dir-only restore (~7-10 s). Speed itself is measured in bench/, not asserted here. The small files
travel in packs (``cachesvc.content.packs``), so the hits come from a packed restore.
"""
from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.containers import Container
from harness.service import ServiceProcess
from tests import shipped

pytestmark = pytest.mark.slow

MODEL, SHAPE, TAG = "mlp", "f32[8,256]", "mode=default"


def assert_restored_and_compiled_nothing(result: dict, ctr: Container) -> None:
    counters = result["counters"]
    report = result["restore"]
    # the report first: a file the restore could not place explains a miss below. (Two CI runs missed
    # AOTAutograd's entry alone, with FX graph hits: the runner's CI=true reached this container and not
    # the demo's, and torch keys AOTAutograd on it; tests/conftest.py now takes CI out of the run.)
    assert report["hit"] and not report["failed"] and not report["warnings"], report
    seen = f"{counters}; files in the container's roots: {sorted(ctr.artifacts())}; report: {report}"
    assert counters.get("fxgraph_cache_hit", 0) >= 1, seen
    assert counters.get("fxgraph_cache_miss", 0) == 0, seen
    assert counters.get("autograd_cache_hit", 0) >= 1, seen
    assert counters.get("autograd_cache_miss", 0) == 0, seen
    assert report["roots"].keys() >= {"inductor", "pch"}
    files = ctr.artifacts()
    assert any(f.startswith("pch:") and f.endswith(".gch") for f in files), "the precompiled header came back"
    assert len(files) == report["files"], (
        "the restored process wrote compile artifacts of its own: "
        f"{len(files)} files in its roots, {report['files']} restored")


def cli_publish(ctr: Container, client_env: dict, venv: shipped.Venv) -> dict:
    """The container's snapshot published by the installed `cachesvc-client`."""
    env = ctr.env(**client_env)
    env.pop("PYTHONPATH")
    out = subprocess.run([str(venv.bin / "cachesvc-client"), "publish", "--name", MODEL, "--shape", SHAPE, "--tag", TAG,
                          "--json"], env=env, cwd=ctr.root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def outside_the_checkout(dest: Path) -> Path:
    """A copy of demo/ and harness/ (what the demo runs besides cachesvc) in ``dest``, nothing else of the tree."""
    for rel in shipped.tracked_files():
        if rel.startswith(("demo/", "harness/")):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(shipped.ROOT / rel, dest / rel)
    return dest


def counters(said: str, which: str) -> dict:
    return ast.literal_eval(re.search(rf"^{which} counters:\s+(\{{.*\}})$", said, re.M).group(1))


def test_the_restart_demo_from_the_wheel_then_a_restore_from_postgres_and_s3(tmp_path, postgres_url,
                                                                             s3_storage_settings):
    venv = shipped.venv("torch")
    src = outside_the_checkout(tmp_path / "src")
    work = tmp_path / "demo-runs"
    env = shipped.bare_env(tmp_path / "user", venv)
    where = shipped.imported_from(venv, ["cachesvc", "cachesvc_client", "harness.containers"], {**env, "PYTHONPATH": str(src)},
                                  tmp_path)
    assert all(not Path(p).resolve().is_relative_to(shipped.ROOT) for p in where.values()), where
    demo = subprocess.run([str(venv.python), str(src / "demo" / "restart.py"), "--model", MODEL, "--workdir", str(work)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert demo.returncode == 0 and "result: restore HIT" in demo.stdout, demo.stdout[-3000:] + demo.stderr[-3000:]
    print(demo.stdout)
    assert counters(demo.stdout, "cold").get("fxgraph_cache_miss", 0) >= 1
    restored = counters(demo.stdout, "restored")
    assert restored.get("autograd_cache_hit", 0) >= 1 and not restored.get("autograd_cache_miss"), restored
    files = int(re.search(r"restore: (\d+) files", demo.stdout).group(1))

    production = ServiceProcess(tmp_path / "production", python=venv.python, env={
        "CACHESVC_DATABASE_URL": postgres_url, "CACHESVC_AUTO_MIGRATE": "1",
        **{f"CACHESVC_{k}": v for k, v in s3_storage_settings.items()}})
    with production:
        # the demo's restarted container: what it restored, and nothing it compiled since
        ctr = Container(work / "containers", python=str(venv.python), harness=src)
        published = cli_publish(ctr, production.client_env(), venv)
        assert published["files"] == files and set(published["roots"]) >= {"inductor", "pch"}, published
        assert published["uploaded_packs"] >= 1, "the small files travel in packs: the restore reads them"
        ctr.restart()
        assert not any(Path(ctr.tmp).iterdir()) and not any(Path(ctr.home).iterdir())
        warm = ctr.run_worker("--model", MODEL, "--restore", **production.client_env())
        assert warm["restore"]["files"] == files
        assert "restore_overlapped_s" in warm  # started before `import torch`, keyed without it
        assert_restored_and_compiled_nothing(warm, ctr)
