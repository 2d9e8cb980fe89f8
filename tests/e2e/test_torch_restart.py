"""End to end with real torch.compile on the CPU, each process a fresh container.

A cold container compiles and publishes; a restarted container (same paths,
empty HOME, TMPDIR and cache dir) restores and compiles. Its inductor
counters must show FX-graph and AOTAutograd hits and no miss, and it must
write no compile artifact of its own: every file in its roots afterwards is
one the restore brought (no rebuilt precompiled header, no new .so), which is
what separates the floor (~1.7-3.5 s here) from a cache-dir-only restore
(~7-10 s). Speed itself is measured in bench/, not asserted here. The small
files travel in packs (``cachesvc.content.packs``), so the hits come from a packed restore.

Runs against the embedded default (`cachesvc serve`: SQLite + local blobs)
and against PostgreSQL + S3 (rclone), both as real service processes.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.containers import Container
from harness.service import ServiceProcess

pytestmark = pytest.mark.slow

MODEL, SHAPE, TAG = "mlp", "f32[8,256]", "mode=default"




def assert_restored_and_compiled_nothing(result: dict, ctr: Container) -> None:
    counters = result["counters"]
    assert counters.get("fxgraph_cache_hit", 0) >= 1, counters
    assert counters.get("fxgraph_cache_miss", 0) == 0, counters
    assert counters.get("autograd_cache_hit", 0) >= 1, counters
    assert counters.get("autograd_cache_miss", 0) == 0, counters
    report = result["restore"]
    assert report["hit"] and not report["failed"] and not report["warnings"], report
    assert report["roots"].keys() >= {"inductor", "pch"}
    files = ctr.artifacts()
    assert any(f.startswith("pch:") and f.endswith(".gch") for f in files), "the precompiled header came back"
    assert len(files) == report["files"], (
        "the restored process wrote compile artifacts of its own: "
        f"{len(files)} files in its roots, {report['files']} restored")


def cli_publish(ctr: Container, client_env: dict) -> dict:
    import json

    env = ctr.env(**client_env)
    out = subprocess.run([sys.executable, "-m", "cachesvc_client.cli", "publish", "--name", MODEL, "--shape", SHAPE,
                          "--tag", TAG, "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_restarted_container_restores_and_compiles_nothing(tmp_path, postgres_url, s3_storage_settings):
    embedded = ServiceProcess(tmp_path / "embedded")
    production = ServiceProcess(tmp_path / "production", env={
        "CACHESVC_DATABASE_URL": postgres_url, "CACHESVC_AUTO_MIGRATE": "1",
        **{f"CACHESVC_{k}": v for k, v in s3_storage_settings.items()}})
    with embedded, production:
        ctr = Container(tmp_path / "containers")
        cold = ctr.run_worker("--model", MODEL, "--publish", **embedded.client_env())
        assert cold["counters"].get("fxgraph_cache_miss", 0) >= 1, cold["counters"]
        assert cold["publish"]["status"] == "committed"
        assert cold["publish"]["uploaded_packs"] >= 1, "the small files travel in packs: the restores read them"
        published = cold["publish"]["files"]
        assert set(cold["publish"]["roots"]) >= {"inductor", "pch"}
        # The same snapshot through the CLI to the PostgreSQL + S3 service.
        assert cli_publish(ctr, production.client_env())["files"] == published

        floor = ctr.run_worker("--model", MODEL)  # same container again: inherits everything
        assert floor["counters"].get("fxgraph_cache_hit", 0) >= 1
        assert ctr.artifacts() == ctr.artifacts()  # stable listing

        for svc in (embedded, production):
            ctr.restart()
            assert not any(Path(ctr.tmp).iterdir()) and not any(Path(ctr.home).iterdir())
            warm = ctr.run_worker("--model", MODEL, "--restore", **svc.client_env())
            assert warm["restore"]["files"] == published
            assert "restore_overlapped_s" in warm  # started before `import torch`, keyed without it
            assert_restored_and_compiled_nothing(warm, ctr)
            print(f"{svc.data_dir.name}: cold {cold['first_call_s']:.2f} s, floor {floor['first_call_s']:.2f} s, "
                  f"restore {warm['restore_s']:.2f} s + first call {warm['first_call_s']:.2f} s")
