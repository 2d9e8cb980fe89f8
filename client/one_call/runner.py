"""Load: a package opened by torch's C++ loader and bound to the live model's tensors.

``torch._C._aoti.AOTIModelPackageLoader`` opens it (no Dynamo, no Inductor import, no C++ or
Triton compile, no autotuning) and ``load_constants(..., user_managed=True)`` points it at the live
model's parameters and buffers: the weights the process has are the weights it runs with, and
in-place updates (``load_state_dict``, an optimizer step) are seen.

``torch._inductor.aoti_load_package`` would do the same load but imports Inductor first (9.3-9.6 s
on the bench CPU against 1.0 s for the whole process with the C++ loader), so the loader is used
directly. reduce-overhead on a GPU replays the run from a CUDA graph (graph.py).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from . import computed
from .binding import live_constants  # noqa: F401 - the runner's constants, by name (verify, bench)
from ..errors import LoadFailed

log = logging.getLogger("cachesvc_client")


#: CUDA graphs kept per runner, one per input shape (declared shapes: calls.py); calls of further
#: shapes run the package without one (each graph holds its own memory pool)
MAX_GRAPHS = 8


class Runner:
    """A loaded package bound to live tensors: ``runner(*tensors)`` (the call's tensors, flattened as
    calls.leaves does) returns what the model would: the output's structure (a tuple, a dict, a
    transformers ModelOutput) is the package's call spec, rebuilt from its leaves.

    ``cuda_graph``: the first call of each input shape runs the package as it is, the second captures
    the run into a CUDA graph, and every later call of that shape replays it (graph.py); a capture that
    fails is logged once and the package runs without graphs. The capture (two warm-up runs and the
    recorded one) stays off the first output, as torch.compile's cudagraph trees record at the second
    call: on the H100 it was 0.3-0.6 s of the first call of regnet_y_400mf and GPT-2 (docs/benchmarks.md)."""

    def __init__(self, path: str, constants: Mapping[str, Any], device: str, *, cuda_graph: bool = False):
        import torch
        from torch.utils import _pytree as pytree

        index = -1 if device == "cpu" else (torch.device(device).index or 0)
        try:
            self._loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, index)
            fqns = list(self._loader.get_constant_fqns())
            # the tensors the computation itself makes, which the package carries (computed.py); the runner
            # holds them: the loader reads them in place (user_managed)
            self._computed = computed.read(path, device) if any(f not in constants for f in fqns) else {}
            missing = [f for f in fqns if f not in constants and f not in self._computed]
            if missing:
                raise LoadFailed(f"the package wants constants the model lacks: {missing[:3]}")
            # user_managed: the package reads the model's own tensors, no copy (in-place updates are seen)
            self._fqns = fqns
            self._loader.load_constants(self._bound(constants), False, True, True)
            in_spec, out_spec = self._loader.get_call_spec()
            #: the call's structure the package was exported for (calls.CallSpec.structure must equal it)
            self.in_spec = pytree.treespec_loads(in_spec)
            self._out_spec = pytree.treespec_loads(out_spec)
        except LoadFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - torch raises many types for a package it cannot use
            raise LoadFailed(f"AOTIModelPackageLoader could not load {path}: {type(exc).__name__}: {exc}") from exc
        self._unflatten: Callable = pytree.tree_unflatten
        self.cuda_graph = cuda_graph
        self._graphs: Dict[tuple, Callable] = {}
        self._ran: set = set()  # input shapes run once without a graph: their next call captures one
        self.capture_seconds: Optional[float] = None  # the first capture's
        self.capture_phases: Dict[str, float] = {}  # where the first capture's seconds went (graph.py)
        self.capture_error = ""

    @property
    def constant_fqns(self) -> List[str]:
        """The names of the constants the package runs on."""
        return list(self._fqns)

    def rebind(self, constants: Mapping[str, Any]) -> None:
        """Point the package at other tensors of the same layouts (binding.py decides): the model's
        replaced parameters. CUDA graphs captured on the old ones are captured again at their next call."""
        try:
            self._loader.load_constants(self._bound(constants), False, True, True)
        except Exception as exc:  # noqa: BLE001 - as in __init__: the caller falls back to torch.compile
            raise LoadFailed(f"the package could not be rebound: {type(exc).__name__}: {exc}") from exc
        self._graphs = {}

    def _bound(self, constants: Mapping[str, Any]) -> Dict[str, Any]:
        """The package's constants by name: the model's, and the computed ones it carries."""
        return {f: constants[f] if f in constants else self._computed[f] for f in self._fqns}

    def __call__(self, *args: Any) -> Any:
        if self.cuda_graph:
            shapes = tuple(tuple(a.shape) for a in args)
            graphed = self._graphs.get(shapes)
            if graphed is None and shapes in self._ran and len(self._graphs) < MAX_GRAPHS:
                graphed = self._capture(shapes, args)
            self._ran.add(shapes)
            if graphed is not None:
                return self._unflatten(graphed(args), self._out_spec)
        return self._unflatten(self._loader.run(list(args)), self._out_spec)

    def _capture(self, shapes: tuple, args: Sequence[Any]) -> Optional[Callable]:
        from .graph import GraphedRun

        started = time.monotonic()
        try:
            graphed = GraphedRun(self._loader.run, args)
        except Exception as exc:  # noqa: BLE001 - without a graph the package still runs, only slower
            self.cuda_graph, self.capture_error = False, f"{type(exc).__name__}: {exc}"
            log.warning("cachesvc compile: the package runs without a CUDA graph: capturing it failed: %s",
                        self.capture_error)
            return None
        if self.capture_seconds is None:
            self.capture_seconds, self.capture_phases = time.monotonic() - started, dict(graphed.phases)
        self._graphs[shapes] = graphed
        return graphed
