"""A FastAPI inference app that starts from the compile cache (docs/integrations.md, "FastAPI").

At start-up, before the first compile: restore this key's compile state (a miss, or a cache
service that is down, costs seconds and the app compiles cold). Then torch.compile the model,
warm it up on the serving shape, and, for a publisher pod, write the seconds the warm-up spent
compiling into $WARMUP_DONE_FILE: the sidecar of deploy/kubernetes/examples/inference publishes
when it appears.

    CACHESVC_URL=http://cachesvc:8787 CACHESVC_TOKEN=cs_... TORCHINDUCTOR_CACHE_DIR=/var/cache/torchinductor \
        uvicorn --app-dir deploy/integrations fastapi_app:app --port 8080

tests/deploy/test_integrations.py runs it in two fresh containers: the second one's compile hits.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import List

import torch
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from cachesvc_client import CacheClient
from stand_in_model import BATCH, FEATURES, SHAPE, build_model, cache_counters, example_inputs

log = logging.getLogger("fastapi_app")

NAME = os.environ.get("MODEL_NAME", "fastapi-mlp")


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    # 1. Restore before anything compiles. With the init container of deploy/kubernetes this
    #    finds the files already there and costs a resolve; alone, it does the whole restore.
    report = CacheClient().restore(NAME, SHAPE) if os.environ.get("CACHESVC_URL") else None
    model = build_model()
    # 2. Compile and warm up.
    # ---- ONE-CALL VARIANT (issue 18) -------------------------------------------------------
    # When `cachesvc_client.compile` lands, steps 1 and 2 become one call:
    #     compiled = cachesvc_client.compile(model, (example_inputs(),), name=NAME)
    # ------------------------------------------------------------------------------------------
    compiled = torch.compile(model)
    started = time.perf_counter()
    with torch.no_grad():
        compiled(example_inputs())
    warmup = time.perf_counter() - started
    # 3. A publisher pod says warm-up is done; the sidecar publishes what it compiled.
    done = os.environ.get("WARMUP_DONE_FILE")
    if done:
        with open(done + ".tmp", "w") as f:  # atomically: the sidecar must never read half a number
            f.write(f"{warmup:.3f}\n")
        os.replace(done + ".tmp", done)
    app.state.compiled, app.state.warmup = compiled, warmup
    app.state.restored = bool(report and report.hit)
    log.info("ready: restored=%s warm-up %.1f s %s", app.state.restored, warmup, cache_counters())
    yield


app = FastAPI(lifespan=lifespan)


class Batch(BaseModel):
    inputs: List[List[float]]


@app.get("/ready")
def ready() -> dict:
    return {"restored": app.state.restored, "warmup_seconds": round(app.state.warmup, 3), **cache_counters()}


@app.post("/predict")
def predict(batch: Batch) -> dict:
    x = torch.tensor(batch.inputs, dtype=torch.float32)
    if tuple(x.shape) != (BATCH, FEATURES):
        raise HTTPException(422, f"inputs must be {BATCH} rows of {FEATURES} numbers, got {list(x.shape)}")
    with torch.no_grad():
        return {"outputs": app.state.compiled(x).tolist()}
