"""The stand-in model of the runnable recipes (fastapi_app.py, ray_serve_app.py): built the same way in
every container, as a checkpoint would be, and Inductor's cache counters to show what was hit."""
from __future__ import annotations

import sys

import torch

BATCH, FEATURES = 8, 64
SHAPE = f"f32[{BATCH},{FEATURES}]"  # the key's shape: what the warm-up compiles for


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)  # the weights stand in for a checkpoint: the same in every container
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 256), torch.nn.GELU(), torch.nn.Linear(256, 16)).eval()


def example_inputs() -> torch.Tensor:
    return torch.linspace(-1, 1, BATCH * FEATURES).reshape(BATCH, FEATURES)


def cache_counters() -> dict:
    """Inductor's FX graph cache hits and misses in this process (none where Dynamo was never imported:
    the one call's hit runs without it, and asking must not import it)."""
    if "torch._dynamo" not in sys.modules:
        return {"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 0}
    from torch._dynamo.utils import counters

    return {"fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
            "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"]}
