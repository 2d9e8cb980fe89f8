"""A FastAPI inference app that starts from the compile cache (docs/integrations.md, "FastAPI").

At start-up, before the first compile: restore this key's compile state (a miss, or a cache
service that is down, costs seconds and the app compiles cold). Then torch.compile the model,
warm it up on the serving shape, and, for a publisher pod, write the seconds the warm-up spent
compiling into $WARMUP_DONE_FILE: the sidecar of deploy/kubernetes/examples/inference publishes
when it appears.

    CACHESVC_URL=http://cachesvc:8787 CACHESVC_TOKEN=cs_... TORCHINDUCTOR_CACHE_DIR=/var/cache/torchinductor \
        uvicorn --app-dir deploy/integrations fastapi_app:app --port 8080

With ONE_CALL=1 the restore and torch.compile are one call, ``cachesvc_client.compile``: a hit runs
the published AOTInductor package on the model's own weights, nothing traced or compiled (Dynamo's guards
check that the package is this model's computation); a miss
compiles and, with a write token, publishes in the background (PUBLISH_WAIT_SECONDS: how long start-up
waits for that, as a build job or the first replica would). Before the app takes traffic, ``warm_up()``
runs every shape the fleet served once (learned shapes' packages, or a compile now rather than mid-traffic):
the readiness probe (/ready) answers only after it.

tests/deploy/test_integrations.py runs both in two fresh containers: the second one's compile hits.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from typing import List

import torch
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

import cachesvc_client
from cachesvc_client import CacheClient
from stand_in_model import BATCH, FEATURES, SHAPE, build_model, cache_counters, example_inputs

log = logging.getLogger("fastapi_app")

NAME = os.environ.get("MODEL_NAME", "fastapi-mlp")


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    if os.environ.get("ONE_CALL") == "1":
        # The one call: restore + load the package (a hit), or torch.compile + publish (a miss).
        compiled = cachesvc_client.compile(build_model(), (example_inputs(),), name=NAME)
        report = None
    else:
        # 1. Restore before anything compiles. With the init container of deploy/kubernetes this
        #    finds the files already there and costs a resolve; alone, it does the whole restore.
        report = CacheClient().restore(NAME, SHAPE) if os.environ.get("CACHESVC_URL") else None
        # 2. Compile and warm up.
        compiled = torch.compile(build_model())
    started = time.perf_counter()
    app.state.warmed = None
    with torch.no_grad():
        if hasattr(compiled, "warm_up"):  # the one call: every shape the fleet served (the example's too), once
            app.state.warmed = compiled.warm_up()
        else:
            compiled(example_inputs())
    warmup = time.perf_counter() - started
    if os.environ.get("PUBLISH_WAIT_SECONDS") and hasattr(compiled, "wait_published"):
        log.info("published: %s", compiled.wait_published(float(os.environ["PUBLISH_WAIT_SECONDS"])))
    # 3. A publisher pod says warm-up is done; the sidecar publishes what it compiled.
    done = os.environ.get("WARMUP_DONE_FILE")
    if done:
        with open(done + ".tmp", "w") as f:  # atomically: the sidecar must never read half a number
            f.write(f"{warmup:.3f}\n")
        os.replace(done + ".tmp", done)
    app.state.compiled, app.state.warmup = compiled, warmup
    app.state.restored = bool(report and report.hit) or getattr(compiled, "calls", {}).get("artifact", 0) > 0
    log.info("ready: restored=%s warm-up %.1f s %s", app.state.restored, warmup, cache_counters())
    yield


app = FastAPI(lifespan=lifespan)


class Batch(BaseModel):
    inputs: List[List[float]]


@app.get("/ready")
def ready() -> dict:
    calls = dict(getattr(app.state.compiled, "calls", {}))  # the one call: what served the calls so far
    warmed = app.state.warmed  # the one call's warm_up(): shapes run before traffic, by package or compile
    return {"restored": app.state.restored, "warmup_seconds": round(app.state.warmup, 3), "calls": calls,
            "warmed": {k: warmed[k] for k in ("seconds", "packages", "compiled")} if warmed else None,
            # nothing traced or compiled in this process: Dynamo's compiler and Inductor's never ran
            "compiler_imported": "torch._inductor.compile_fx" in sys.modules, **cache_counters()}


@app.post("/predict")
def predict(batch: Batch) -> dict:
    x = torch.tensor(batch.inputs, dtype=torch.float32)
    if tuple(x.shape) != (BATCH, FEATURES):
        raise HTTPException(422, f"inputs must be {BATCH} rows of {FEATURES} numbers, got {list(x.shape)}")
    with torch.no_grad():
        return {"outputs": app.state.compiled(x).tolist()}
