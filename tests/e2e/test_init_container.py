"""An init container without torch restores what a torch process published, and the app then hits.

The Kubernetes path of docs/client.md, with real parts: a real `cachesvc serve`, the app
"image" (this venv, with torch) that compiles, publishes and writes its environment with
`cachesvc-client env --json`, and an init "image": a venv made here with the client and its
five dependencies only (no torch, no server dependencies), whose `cachesvc-client restore`
first misses (it cannot read torch: the message says so and how to fix it) and then, with
`--env-file`, restores into the folders the app shares with it (same HOME, TMPDIR and cache
dir: one volume). The app's next start then compiles with FX-graph and AOTAutograd cache
hits, and its `client.verify()` verdict shows in the init image's `cachesvc-client status`.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
import requests

from cachesvc_client import keyenv
from harness.containers import REPO, Container
from harness.models import signature
from harness.service import ServiceProcess

pytestmark = pytest.mark.slow

MODEL, TAG = "mlp", "mode=default"
CLIENT_DEPENDENCIES = ("requests", "zstandard", "filelock", "click", "tqdm")


def _requirements(dist: md.Distribution) -> Iterator[str]:
    """Names of what ``dist`` needs on this platform, extras left out."""
    from packaging.requirements import Requirement

    for text in dist.requires or ():
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            yield req.name


def _closure(names) -> List[md.Distribution]:
    seen: Dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        dist = md.distribution(name)
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key not in seen:
            seen[key] = dist
            todo += list(_requirements(dist))
    return list(seen.values())


def client_only_venv(base: Path) -> Path:
    """A venv with nothing but cachesvc's client and its dependencies; returns its bin folder.

    Made offline: the dependencies are this venv's installed copies (their top-level files, linked
    into one folder that a .pth puts on the new venv's path), and the project is a wheel built
    from a copy of this checkout with this venv's setuptools and installed with --no-deps."""
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    deps = base / "deps"
    deps.mkdir()
    for dist in _closure(CLIENT_DEPENDENCIES):
        tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            os.symlink(dist.locate_file(top), deps / top)
    purelib = subprocess.run([str(venv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "cachesvc-client-deps.pth").write_text(f"{deps}\n")
    src = base / "src"  # a copy: building writes build/ and *.egg-info beside the sources
    src.mkdir()
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / part, src / part)
    for part in ("cachesvc", "client", "migrations"):
        shutil.copytree(REPO / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = base / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(wheels), str(src)], check=True, timeout=300, capture_output=True)
    [wheel] = wheels.glob("cachesvc-*.whl")
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", str(wheel)], check=True, timeout=300, capture_output=True)
    return venv / "bin"


def init_env(ctr: Container, bin_dir: Path, **extra: str) -> Dict[str, str]:
    """The init container's environment: the app container's folders (one shared volume), the init image's PATH."""
    env = ctr.env(**extra)
    env.pop("PYTHONPATH", None)  # nothing of this checkout: the init image has the installed client only
    env["PATH"] = os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])
    return env


def run(cmd: List[str], env: Dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def test_an_init_container_without_torch_restores_with_the_apps_env_file_and_the_app_hits(tmp_path):
    bin_dir = client_only_venv(tmp_path / "init-image")
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
