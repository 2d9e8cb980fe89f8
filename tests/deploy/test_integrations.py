"""docs/integrations.md's runnable recipes, each in two fresh containers (own HOME, TMPDIR, cache dir):
the first compiles cold and publishes, the second restores at start-up and its torch.compile hits
Inductor's FX graph cache (its counters say so).

FastAPI: deploy/integrations/fastapi_app.py under uvicorn; the first container says warm-up is
done and the sidecar's publish follows; the outputs equal eager's. Ray Serve:
deploy/integrations/ray_serve_app.py in a local Ray cluster, where `ray[serve]` is installed."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import requests

from tests.deploy.k8s import ROOT
from tests.deploy.processes import BIN, SQLITE_LOCAL, Program, base_env, free_port


APP_DIR = ROOT / "deploy" / "integrations"


def serve(base: Path, url: str, token: str, **extra: str):
    """Start the app in a container rooted at ``base``; returns (program, its URL, its env)."""
    (base / "cache").mkdir(parents=True, exist_ok=True)
    env = base_env(base, CACHESVC_URL=url, CACHESVC_TOKEN=token, TORCHINDUCTOR_CACHE_DIR=str(base / "cache"),
                   **extra)
    # --port 0: uvicorn binds only after the app's start-up (a compile and publish: tens of seconds), so a
    # port picked free beforehand could be taken by then; it names the port it bound in its "running on" line
    program = Program([str(BIN / "python"), "-m", "uvicorn", "--app-dir", str(APP_DIR), "fastapi_app:app",
                       "--host", "127.0.0.1", "--port", "0"], env)
    program.wait_for("Uvicorn running on", timeout=600)
    running = next(line for line in program.lines if "Uvicorn running on" in line)
    url = re.search(r"http://127\.0\.0\.1:\d+", running).group(0)
    return program, url, env


def close(outputs: list, expected: list) -> None:
    import torch

    torch.testing.assert_close(torch.tensor(outputs), torch.tensor(expected), rtol=1e-4, atol=1e-5)


def eager_outputs() -> tuple:
    import sys

    sys.path.insert(0, str(APP_DIR))
    try:
        import fastapi_app
    finally:
        sys.path.remove(str(APP_DIR))
    with fastapi_app.torch.no_grad():
        outputs = fastapi_app.build_model()(fastapi_app.example_inputs())
    return outputs.tolist(), fastapi_app.example_inputs().tolist()


@pytest.mark.slow
@SQLITE_LOCAL
def test_a_second_fastapi_container_starts_from_what_the_first_compiled(live_server, tokens, tmp_path):
    pytest.importorskip("uvicorn", reason="the FastAPI recipe needs fastapi and uvicorn (the test extra has them)")
    expected, inputs = eager_outputs()
    warm = tmp_path / "a" / "signal" / "warm"
    warm.parent.mkdir(parents=True)
    first, first_url, first_env = serve(tmp_path / "a", live_server.url, tokens["read"], WARMUP_DONE_FILE=str(warm))
    try:
        cold = requests.get(first_url + "/ready", timeout=30).json()
        assert cold["restored"] is False and cold["fxgraph_cache_miss"] > 0 and cold["fxgraph_cache_hit"] == 0
        outputs = requests.post(first_url + "/predict", json={"inputs": inputs}, timeout=60).json()["outputs"]
        close(outputs, expected)
        bad = requests.post(first_url + "/predict", json={"inputs": inputs[:3]}, timeout=60)
        assert bad.status_code == 422 and "8 rows of 64 numbers" in bad.text
        seconds = float(warm.read_text())
        assert seconds > 0
        # The sidecar's step (deploy/kubernetes/examples/inference/model-warmup.yaml), with the write token.
        published = subprocess.run(
            [str(BIN / "cachesvc-client"), "publish", "--name", "fastapi-mlp", "--shape", "f32[8,64]",
             "--compile-seconds", str(seconds)], env={**first_env, "CACHESVC_TOKEN": tokens["write"]},
            capture_output=True, text=True, timeout=300)
        assert published.returncode == 0, published.stderr
    finally:
        first.stop()

    second, second_url, _ = serve(tmp_path / "b", live_server.url, tokens["read"])
    try:
        hot = requests.get(second_url + "/ready", timeout=30).json()
        assert hot["restored"] is True
        assert hot["fxgraph_cache_hit"] > 0 and hot["fxgraph_cache_miss"] == 0, hot
        outputs = requests.post(second_url + "/predict", json={"inputs": inputs}, timeout=60).json()["outputs"]
        close(outputs, expected)
    finally:
        second.stop()


@pytest.mark.slow
@SQLITE_LOCAL
def test_the_one_call_fastapi_variant_starts_a_second_container_without_compiling(live_server, tokens, tmp_path):
    """ONE_CALL=1: the first container compiles and publishes snapshot + package (its start-up waits for the
    publish, as a build job would); the second serves from the package: no compiler imported, no torch.compile
    call (Dynamo's guard code checks the package's proof)."""
    pytest.importorskip("uvicorn", reason="the FastAPI recipe needs fastapi and uvicorn (the test extra has them)")
    expected, inputs = eager_outputs()
    first, first_url, _ = serve(tmp_path / "a", live_server.url, tokens["write"], ONE_CALL="1",
                                PUBLISH_WAIT_SECONDS="300")
    try:
        cold = requests.get(first_url + "/ready", timeout=30).json()
        assert cold["restored"] is False and cold["calls"]["torch.compile"] == 1, cold
    finally:
        first.stop()

    second, second_url, _ = serve(tmp_path / "b", live_server.url, tokens["read"], ONE_CALL="1")
    try:
        outputs = requests.post(second_url + "/predict", json={"inputs": inputs}, timeout=60).json()["outputs"]
        close(outputs, expected)
        hot = requests.get(second_url + "/ready", timeout=30).json()
        assert hot["restored"] is True and hot["compiler_imported"] is False, (hot, second.lines[-20:])
        assert hot["calls"] == {"artifact": 2, "torch.compile": 0}, hot  # the warm-up and the request
        assert hot["warmed"]["packages"] == 1 and hot["warmed"]["compiled"] == 0, hot  # the example's shape
    finally:
        second.stop()


RAY_DRIVER = """
import json, os, sys
import ray
from ray import serve
app_dir = sys.argv[1]
sys.path.insert(0, app_dir)
keep = ("CACHESVC_URL", "CACHESVC_TOKEN", "TORCHINDUCTOR_CACHE_DIR", "HOME", "TMPDIR", "USER", "CACHESVC_PUBLISH")
ray.init(num_cpus=2, include_dashboard=False,
         runtime_env={"env_vars": {**{k: os.environ[k] for k in keep if k in os.environ}, "PYTHONPATH": app_dir}})
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[2])})
import ray_serve_app
handle = serve.run(ray_serve_app.app, name="mlp", route_prefix=None)
print("INFO " + json.dumps(handle.info.remote().result()), flush=True)
serve.shutdown()
ray.shutdown()
"""


def ray_container(base: Path, url: str, token: str, **extra: str) -> dict:
    """A local Ray cluster in a fresh container: runs deploy/integrations/ray_serve_app.py, returns its info."""
    (base / "cache").mkdir(parents=True, exist_ok=True)
    env = base_env(base, CACHESVC_URL=url, CACHESVC_TOKEN=token, TORCHINDUCTOR_CACHE_DIR=str(base / "cache"), **extra)
    done = subprocess.run([str(BIN / "python"), "-c", RAY_DRIVER, str(APP_DIR), str(free_port())], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("INFO ")]
    return json.loads(line[len("INFO "):])


@pytest.mark.slow
@SQLITE_LOCAL
def test_a_second_ray_serve_replica_starts_from_what_the_publishing_one_compiled(live_server, tokens, tmp_path):
    """Runs where `ray[serve]` is installed (not in the test extra: a few hundred MB for this one test)."""
    pytest.importorskip("ray.serve", reason="the Ray Serve recipe needs `pip install 'ray[serve]'`")
    cold = ray_container(tmp_path / "a", live_server.url, tokens["write"], CACHESVC_PUBLISH="1")
    assert cold["restored"] is False and cold["fxgraph_cache_miss"] > 0
    hot = ray_container(tmp_path / "b", live_server.url, tokens["read"])
    assert hot["restored"] is True and hot["fxgraph_cache_hit"] > 0 and hot["fxgraph_cache_miss"] == 0, hot
