"""``reduce-overhead`` for a package: the loader's run captured once into a CUDA graph, then replayed.

torch.compile's reduce-overhead records CUDA graphs of the code Inductor
generated (cudagraph trees). A hit of the one call runs no Inductor code: the
C++ loader runs the package, one kernel launch after another, each paying
the CPU's launch cost. So the run itself is captured: static input buffers
with the example inputs' strides, warm-up runs on a side stream (cuBLAS and
cuDNN make their handles and workspaces outside the capture, where
allocating is allowed), one capture, and every later call copies its inputs
into the static buffers, replays the graph and returns copies of its
outputs. torch.compile hands out the graph's own output tensors, which the
next replay overwrites (it warns when one is read afterwards); a copy of a
model's outputs costs little and never changes under the caller.

The live weights stay where they are: the package reads the model's own
tensors (runner.Runner), so the graph reads them too, and in-place
updates (``load_state_dict``, ``copy_``) are seen by later replays.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Sequence

#: runs before the capture: the first makes the lazily created handles and workspaces, the second
#: runs as the captured one will (torch.compile's cudagraph trees also warm up before recording)
WARMUPS = 2


class GraphedRun:
    """``GraphedRun(run, inputs)``: ``run`` (a list of tensors -> a list of tensors) captured for inputs
    shaped and strided like ``inputs``; calling it with such inputs replays the capture.

    ``phases``: where the set-up's seconds went, each phase synchronized so its seconds are its own:
    ``warmup1`` (the first run: lazily loaded kernels, cuBLAS/cuDNN handles and workspaces, cuDNN's
    plan choice per convolution shape, the allocator's first blocks), ``warmup2``, and ``capture``
    (torch.cuda.graph: a synchronize, empty_cache, then the recorded run)."""

    def __init__(self, run: Callable[[List[Any]], List[Any]], example_inputs: Sequence[Any]):
        import torch

        self._torch = torch
        self._device = example_inputs[0].device  # the graph's streams are this device's, whatever is current
        self.phases: Dict[str, float] = {}
        with torch.cuda.device(self._device):
            self._static = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x)
                            for x in example_inputs]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for n in range(WARMUPS):
                    started = time.monotonic()
                    run(self._static)
                    side.synchronize()
                    self.phases[f"warmup{n + 1}"] = time.monotonic() - started
            torch.cuda.current_stream().wait_stream(side)
            started = time.monotonic()
            self._graph = torch.cuda.CUDAGraph()
            # relaxed: before each run the loader queries the CUDA event its last run recorded (is that model
            # instance free?), a call the global and thread_local capture modes forbid in the capturing thread
            with torch.cuda.graph(self._graph, capture_error_mode="relaxed"):
                self._outputs = run(self._static)
            self.phases["capture"] = time.monotonic() - started
        self._lock = threading.Lock()  # one set of static buffers: calls from two threads take turns

    def __call__(self, inputs: Sequence[Any]) -> List[Any]:
        with self._lock, self._torch.cuda.device(self._device):
            for static, given in zip(self._static, inputs):
                static.copy_(given)
            self._graph.replay()
            return [t.clone() for t in self._outputs]
