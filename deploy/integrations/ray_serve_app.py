"""A Ray Serve deployment that starts from the compile cache (docs/integrations.md, "Ray Serve").

Each replica restores before it compiles, then warms up; the replica of the publishing deployment
(CACHESVC_PUBLISH=1, a write token) publishes what its warm-up compiled. The replicas read
CACHESVC_URL, CACHESVC_TOKEN, TORCHINDUCTOR_CACHE_DIR, HOME and TMPDIR from their environment
(runtime_env's env_vars, or the pod's on KubeRay).

    serve run --app-dir deploy/integrations ray_serve_app:app
"""
from __future__ import annotations

import os
import time

import torch
from ray import serve
from starlette.requests import Request

from cachesvc_client import CacheClient
from stand_in_model import SHAPE, build_model, cache_counters, example_inputs

NAME = os.environ.get("MODEL_NAME", "ray-mlp")


@serve.deployment(ray_actor_options={"num_cpus": 1})
class Classifier:
    def __init__(self):
        client = CacheClient()
        self.restored = bool(os.environ.get("CACHESVC_URL")) and client.restore(NAME, SHAPE).hit
        # ---- ONE-CALL VARIANT (issue 18): cachesvc_client.compile(build_model(), (example_inputs(),), name=NAME)
        self.model = torch.compile(build_model())
        started = time.perf_counter()
        with torch.no_grad():
            self.model(example_inputs())
        self.warmup = time.perf_counter() - started
        if os.environ.get("CACHESVC_PUBLISH") == "1":  # one publisher per key, never the whole fleet
            client.publish(NAME, SHAPE)

    def info(self) -> dict:
        return {"restored": self.restored, "warmup_seconds": round(self.warmup, 3), **cache_counters()}

    def predict(self, inputs: list) -> list:
        with torch.no_grad():
            return self.model(torch.tensor(inputs, dtype=torch.float32)).tolist()

    async def __call__(self, request: Request) -> dict:
        return {"outputs": self.predict((await request.json())["inputs"])}


app = Classifier.bind()
