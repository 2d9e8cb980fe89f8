"""docs/integrations.md's FastAPI recipe, run: deploy/integrations/fastapi_app.py under uvicorn in
two fresh containers (own HOME, TMPDIR, cache dir). The first compiles cold and says warm-up is
done; the sidecar's publish follows; the second restores at start-up and its torch.compile hits
Inductor's FX graph cache (its counters say so), with the same outputs as eager."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import requests

from tests.deploy.k8s import ROOT
from tests.deploy.processes import BIN, SQLITE_LOCAL, Program, base_env, free_port

pytest.importorskip("fastapi", reason="the FastAPI recipe needs fastapi and uvicorn (the test extra has them)")
pytest.importorskip("uvicorn", reason="the FastAPI recipe needs fastapi and uvicorn (the test extra has them)")

APP_DIR = ROOT / "deploy" / "integrations"


def serve(base: Path, url: str, token: str, **extra: str):
    """Start the app in a container rooted at ``base``; returns (program, its URL, its env)."""
    (base / "cache").mkdir(parents=True, exist_ok=True)
    env = base_env(base, CACHESVC_URL=url, CACHESVC_TOKEN=token, TORCHINDUCTOR_CACHE_DIR=str(base / "cache"),
                   **extra)
    port = free_port()
    program = Program([str(BIN / "python"), "-m", "uvicorn", "--app-dir", str(APP_DIR), "fastapi_app:app",
                       "--host", "127.0.0.1", "--port", str(port)], env)
    program.wait_for("Application startup complete", timeout=600)
    return program, f"http://127.0.0.1:{port}", env


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
