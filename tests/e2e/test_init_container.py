"""An init container without torch restores what a torch process published, and the app then hits.

The Kubernetes path of docs/client.md, with real parts: a real `cachesvc serve`, the app
"image" (this venv, with torch) that compiles, publishes and writes its environment with
`cachesvc-client env --json`, and an init "image": the run's wheel installed with no extras
(tests/shipped.py: the client and its five dependencies, no torch, no server parts), whose
`cachesvc-client restore` first misses (it cannot read torch: the message says so and how to fix it) and then, with
`--env-file`, restores into the folders the app shares with it (same HOME, TMPDIR and cache
dir: one volume). The app's next start then compiles with FX-graph and AOTAutograd cache
hits, and its `client.verify()` verdict shows in the init image's `cachesvc-client status`.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import requests

from cachesvc_client.process import keyenv
from harness.containers import Container
from harness.models import signature
from harness.service import ServiceProcess
from tests import shipped

pytestmark = pytest.mark.slow

MODEL, TAG = "mlp", "mode=default"


def run(cmd: List[str], env: Dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def init_env(ctr: Container, bin_dir: Path, **extra: str) -> Dict[str, str]:
    """The init container's environment: the app container's folders (one shared volume), the init image's PATH."""
    env = ctr.env(**extra)
    env.pop("PYTHONPATH", None)  # nothing of this checkout: the init image has the installed client only
    env["PATH"] = os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])
    return env


def test_an_init_container_without_torch_restores_with_the_apps_env_file_and_the_app_hits(tmp_path):
    bin_dir = shipped.venv("light").bin  # the wheel, installed without extras: the init image's pip install
    py = str(bin_dir / "python")
    probe = run([py, "-c", "import json, sys, importlib.util as u; import cachesvc_client, requests, zstandard, "
                           "filelock, click, tqdm; print(json.dumps([sys.prefix, [m for m in ('torch', 'flask', "
                           "'sqlalchemy', 'numpy') if u.find_spec(m)]]))"], {"PATH": "/usr/bin:/bin"})
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == [str(bin_dir.parent), []], "the client alone: no torch, no server parts"

    with ServiceProcess(tmp_path / "svc") as svc:
        app = Container(tmp_path / "containers", name="app")
        cold = app.run_worker("--model", MODEL, "--publish", **svc.client_env())
        assert cold["counters"].get("fxgraph_cache_miss", 0) >= 1 and cold["publish"]["status"] == "committed"
        made = run([str(Path(sys.executable).parent / "cachesvc-client"), "env", "--json"], app.env())  # image build
        assert made.returncode == 0, made.stderr
        # nothing on a CPU build; a CUDA build on a GPU-less runner warns that the file names no GPU, and only that
        said = "".join(f"cachesvc-client: warning: {w}\n" for w in keyenv.write_warnings(json.loads(made.stdout)))
        assert made.stderr == said
        env_file = tmp_path / "env.json"
        env_file.write_text(made.stdout)

        app.restart()  # a new pod: the shared volume starts empty
        restore = ["cachesvc-client", "restore", "--name", MODEL, "--shape", signature(MODEL), "--tag", TAG]
        env = init_env(app, bin_dir, **svc.client_env())
        warned = run([py, "-m", "cachesvc_client.cli", "env", "--json"], env)
        assert json.loads(warned.stdout)["torch"] == "none" and "torch is not installed here" in warned.stderr

        miss = run(restore, env)
        assert miss.returncode == 0 and "miss" in miss.stdout, miss.stdout + miss.stderr
        hint = [line for line in miss.stderr.splitlines() if "could not read" in line]
        assert hint and re.search(r"this container could not read torch.* \(torch is not installed here\)", hint[0])
        assert "`cachesvc-client env --json > env.json`" in hint[0] and "--env-file" in hint[0], hint

        hit = run(restore + ["--env-file", str(env_file), "--json"], env)
        assert hit.returncode == 0, hit.stderr
        report = json.loads(hit.stdout)
        assert report["hit"] and not report["failed"] and report["files"] == cold["publish"]["files"], report
        assert report["env"] == json.loads(made.stdout) and report["env_file"] == str(env_file)

        warm = app.run_worker("--model", MODEL, "--verify", **svc.client_env())  # the app: no restore of its own
        counters = warm["counters"]
        assert counters.get("fxgraph_cache_hit", 0) >= 1 and counters.get("fxgraph_cache_miss", 0) == 0, counters
        assert counters.get("autograd_cache_hit", 0) >= 1 and counters.get("autograd_cache_miss", 0) == 0, counters
        assert warm["verify"]["verdict"] == "paid_off" and warm["verify"]["reported"], warm["verify"]
        stats = requests.get(f"{svc.url}/api/v1/stats", timeout=10,
                             headers={"Authorization": f"Bearer {svc.token}"}).json()
        # the verdict carried what the restored compile still cost: saved = the publisher's cold compile minus it
        assert stats["hits"] == 1 and 0 < stats["compile_seconds_saved"] < cold["first_call_s"], stats

        status = run(["cachesvc-client", "status", "--json"], env)
        s = json.loads(status.stdout)
        assert s["restored"] and s["versions"] == report["versions"] and s["verdict"]["verdict"] == "paid_off"
        assert s["files"]["missing"] == 0 and s["files"]["in_place"] == report["files"]
        print(f"cold first call {cold['first_call_s']:.2f} s; after the init container's restore "
              f"{warm['first_call_s']:.2f} s; counters {counters}")
