"""A process that exits while a restore is still in flight is not a failure (issue 39, item 6).

The one call restores the key's snapshot in the background on a hit, and ``start_restore`` does the same
before ``import torch``. A short-lived process exits before that restore ends: its thread pools refuse new
work ("cannot schedule new futures after shutdown"), which the client logged as a failed restore and a
bug. Each process here starts a restore of a 400-file snapshot from a real service and exits after a
delay that lands the exit at another point of the restore; none may log a failure.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.containers import inherited_env
from harness.service import ServiceProcess

pytestmark = pytest.mark.slow
PUBLISH = ("import sys; from cachesvc_client import CacheClient; "
           "CacheClient(cache_dir=sys.argv[1]).publish('quiet', 'f32[1]')")
EXIT_EARLY = ("import sys, time\nfrom cachesvc_client import CacheClient\n"
              "CacheClient(cache_dir=sys.argv[1]).start_restore('quiet', 'f32[1]')\ntime.sleep(float(sys.argv[2]))\n")


def test_exiting_during_a_background_restore_logs_no_failure(tmp_path):
    with ServiceProcess(tmp_path / "svc") as svc:
        env = {**inherited_env(), **svc.client_env(), "HOME": str(tmp_path / "home")}
        cache = tmp_path / "published" / "fxgraph"
        cache.mkdir(parents=True)
        for i in range(400):
            (cache / f"entry{i}").write_bytes(os.urandom(65536))
        subprocess.run([sys.executable, "-c", PUBLISH, str(cache.parent)], env=env, check=True, timeout=300)
        said = []
        for i, delay in enumerate(("0", "0.02", "0.04", "0.06", "0.08", "0.12", "0.2", "0.4")):
            done = subprocess.run([sys.executable, "-c", EXIT_EARLY, str(tmp_path / f"c{i}"), delay], env=env,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
            said += [line for line in done.stderr.splitlines() if "failed" in line or "a bug" in line]
        assert not said, said
