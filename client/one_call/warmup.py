"""``model.warm_up()``: every shape the fleet served, run once before traffic.

Waits for the learned shapes' packages (learned.py), then calls the model once per shape, on inputs made
from the example call (shapes.py): the example's shape, each learned package's, and the fleet's demand
read at start (busiest first, at most ``MAX_SHAPES``), or the shapes given. A shape a package serves
opens its package (and in reduce-overhead captures its CUDA graph); one none serves compiles now, not in
the middle of traffic. In reduce-overhead a shape a package serves runs twice: the package captures
its CUDA graph at a shape's second call (runner.py), and that belongs here too, not in a request.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Sequence

from . import shapes as shapes_mod

log = logging.getLogger("cachesvc_client")

#: the demand's busiest shapes a warm-up runs (with the example's and each learned package's)
MAX_SHAPES = 64


def warm_up(compiled: Any, learned: Any, shapes: Optional[Sequence[str]], timeout: float) -> Dict[str, Any]:
    """Run ``compiled`` (a CompiledModel; ``learned`` its learned.Learned or None) once per shape: what each
    cost and how it was served."""
    started = time.monotonic()
    if learned is not None:
        learned.wait(timeout)
    wanted = list(shapes) if shapes is not None else _shapes(compiled, learned)
    ran: Dict[str, Dict[str, Any]] = {}
    for shape in wanted:
        if time.monotonic() - started > timeout:
            ran[shape] = {"served": "skipped", "why": "the warm-up's timeout passed", "seconds": 0.0}
        else:
            ran[shape] = _run_one(compiled, shape)
    warmed = {"shapes": ran, "seconds": round(time.monotonic() - started, 3),
              "packages": sum(r["served"] == "package" for r in ran.values()),
              "compiled": sum(r["served"] == "compile" for r in ran.values())}
    log.info("cachesvc compile %s: warmed %d shape(s) in %.2f s: %d by a package, %d compiled", compiled.name,
             len(ran), warmed["seconds"], warmed["packages"], warmed["compiled"])
    return warmed


def _shapes(compiled: Any, learned: Any) -> List[str]:
    """The example's shape, each learned package's, then the demand's, busiest first; each once."""
    found = [compiled.shape.partition("|")[0]]
    if learned is not None:
        found += [slot.shape.partition("|")[0] for slot in learned.slots]
        found += [row["shape"] for row in learned.demand[:MAX_SHAPES]]
    return list(dict.fromkeys(found))


def _run_one(compiled: Any, shape: str) -> Dict[str, Any]:
    call = shapes_mod.resized(compiled.args, compiled.call_kwargs, shape)
    if call is None:
        return {"served": "skipped", "why": "not a shape of this model's call", "seconds": 0.0}
    before = compiled.calls["artifact"]
    started = time.monotonic()
    compiled(*call[0], **call[1])
    served = "package" if compiled.calls["artifact"] > before else "compile"
    if served == "package" and compiled.cuda_graph:
        compiled(*call[0], **call[1])  # the capture
    if compiled.device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
    return {"served": served, "seconds": round(time.monotonic() - started, 3)}
