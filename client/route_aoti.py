"""The AOTInductor route of ``compile()``: a .pt2 package without weights, run by torch's C++ loader.

Build (after a miss): ``torch.export`` the model for the example inputs (in
the serving thread, between calls), then, in a child process,
``aoti_compile_and_package`` it with
``aot_inductor.package_constants_in_so=False``: the package holds the
compiled kernels and the wrapper (about 1.5 MB for the bench mlp), not the
weights. Load (a hit): ``torch._C._aoti.AOTIModelPackageLoader`` opens it
(no Dynamo, no Inductor import, no C++ or Triton compile, no autotuning) and
``load_constants(..., user_managed=True)`` points it at the live model's
parameters and buffers: the weights the process has are the weights it runs
with, and in-place updates (``load_state_dict``, an optimizer step) are seen.

``torch._inductor.aoti_load_package`` would do the same load but imports
Inductor first (9.3-9.6 s on the bench CPU against 1.0 s for the whole
process with the C++ loader), so the loader is used directly.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from . import aoti_cxx
from .artifacts import LoadFailed

log = logging.getLogger("cachesvc_client")

KIND = "pt2-package"
LOADER_API = ("run", "load_constants", "get_constant_fqns", "get_call_spec")
#: meta value: the package has no weights; the loader is given the live model's
CONSTANTS = "live"


def support() -> Optional[str]:
    """None when this torch can build and load a package without weights; else why not."""
    import torch

    loader = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
    if loader is None:
        return f"torch {torch.__version__} has no torch._C._aoti.AOTIModelPackageLoader"
    missing = [n for n in LOADER_API if not hasattr(loader, n)]
    if missing:
        return f"torch {torch.__version__}'s AOTIModelPackageLoader has no {', '.join(missing)}"
    import torch._inductor.config as inductor_config  # only the builder gets here (a miss)

    if not hasattr(inductor_config.aot_inductor, "package_constants_in_so"):
        return f"torch {torch.__version__} cannot package without weights (no aot_inductor.package_constants_in_so)"
    return None


def loader_support() -> Optional[str]:
    """What a hit needs, checked without importing Inductor."""
    import torch

    loader = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
    if loader is None or any(not hasattr(loader, n) for n in LOADER_API):
        return f"torch {torch.__version__} has no AOTIModelPackageLoader with {', '.join(LOADER_API)}"
    return None


def host_meta(device: str) -> Dict[str, str]:
    """What a package's machine code needs from the host beyond the key's environment: the CPU's vector ISA."""
    import torch

    return {"cpu_capability": str(torch.backends.cpu.get_cpu_capability()), "constants": CONSTANTS,
            "route": "aoti", "device": device, "cxx_runtime": aoti_cxx.RUNTIME}


def check_host(meta: Dict[str, str], device: str) -> Optional[str]:
    """None when a package with ``meta`` can run here; else why not (the caller falls back)."""
    import torch

    if meta.get("constants") != CONSTANTS or meta.get("route") != "aoti":
        return "the published pt2-package was not made by cachesvc_client.compile"
    if meta.get("cxx_runtime") != aoti_cxx.RUNTIME:  # its wrapper uses the builder's C++ runtime: it can crash here
        return "the published pt2-package's wrapper was not linked with its own C++ runtime (an older client built it)"
    if meta.get("torch") != torch.__version__:
        return f"the package was made by torch {meta.get('torch')}; this process has torch {torch.__version__}"
    here = str(torch.backends.cpu.get_cpu_capability())
    if meta.get("cpu_capability") != here:
        return f"the package was built for CPU ISA {meta.get('cpu_capability')}; this CPU offers {here}"
    if meta.get("device") != device:
        return f"the package was built for device {meta.get('device')}; the inputs are on {device}"
    return None


def export(model: Any, example_inputs: Sequence[Any], path: str) -> None:
    """``torch.export`` a copy of ``model`` for ``example_inputs`` and save the program at ``path`` (.pt2).

    Called in the serving thread, between two calls (one_call.py): export sets torch.fx's module-level
    node metadata, which a compiled call running at the same time in another thread also sets, and
    torch 2.11's compiled ViT-B/16 died of that race (KeyError 'custom', then terminate) when export
    ran in the background thread."""
    import torch

    twin = copy.deepcopy(model)  # export may patch the module it traces; the process keeps the original
    with torch.no_grad():
        torch.export.save(torch.export.export(twin, tuple(example_inputs)), path)


#: Inductor's own timers (torch._dynamo.utils.compilation_time_metrics) that say where a build's
#: seconds go, under the names the publish report gives them. They nest: the kernels' and the
#: wrapper's C++ compiles and the precompiled header are inside ``codegen`` or ``wrapper_compile``.
BUILD_TIMERS = {
    "GraphLowering.run": "lowering",
    "Scheduler.codegen": "codegen",  # kernels generated and compiled (Triton or C++), configs picked
    "AotCodeCompiler.compile": "wrapper_compile",  # the C++ wrapper compiled and linked into the .so
    # inside wrapper_compile; off (aoti_cxx.inductor_options says why), so a build shows it only
    # where a torch precompiles the headers anyway
    "aoti_precompile_header": "precompiled_header",
}


def build(exported: str, path: str, *, mode: Optional[str], timeout: float = 1800) -> Dict[str, float]:
    """Build the weightless package at ``path`` (.pt2) from the program ``export`` saved, in a child process.
    Returns where the build's seconds went (``build_here``'s phases; empty when the child did not say).

    A child: Inductor's code generation is minutes of Python that would hold the GIL from the serving
    thread and patch process-wide config and fx state under it; a compiler or a build that crashes
    takes only the child."""
    done = subprocess.run([sys.executable, "-m", f"{__package__}.aoti_child", "build", exported, path, mode or ""],
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise LoadFailed(f"building the package failed (exit {done.returncode}): {_last_line(done)}")
    return _phases(done.stdout)


def _phases(stdout: str) -> Dict[str, float]:
    """The child's last stdout line, ``{"build_phases": {...}}``; anything else (a torch that printed
    after it, a timer missing) leaves the phases out, never the package."""
    try:
        phases = json.loads(stdout.strip().splitlines()[-1])["build_phases"]
        return {str(k): round(float(v), 3) for k, v in phases.items()}
    except (IndexError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def build_here(exported: str, path: str, mode: Optional[str]) -> Dict[str, float]:
    """The child's part of ``build``; returns its phases in seconds: ``imports`` (torch, Inductor's config
    and the compiler wrapper's set-up, up to the build), ``package`` (``aoti_compile_and_package`` as a whole) and Inductor's own timers (``BUILD_TIMERS``).
    The wrapper is linked with its own C++ runtime (aoti_cxx says why); where that cannot be done no
    package is built: one that could crash the process loading it is worse than none."""
    started = time.monotonic()
    import torch
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import compilation_time_metrics

    # always_keep_tensor_constants: Inductor otherwise inlines small tensors (a 4-element bias) into the
    # kernels' code, where the live model's values never reach them: the package would run on the
    # builder's bias, whatever the process loaded
    options = {"aot_inductor.package_constants_in_so": False, "always_keep_tensor_constants": True}
    if mode and "max-autotune" in mode:
        options["max_autotune"] = True
    with aoti_cxx.self_contained_compiler() as (cxx, why_not):
        if cxx is None:
            raise LoadFailed(f"no self-contained package can be built here: {why_not}")
        options.update(aoti_cxx.inductor_options(cxx))
        imported = time.monotonic()
        program = torch.export.load(exported)
        with torch.no_grad(), inductor_config.patch(options):
            torch._inductor.aoti_compile_and_package(program, package_path=path)
    phases = {"imports": imported - started, "package": time.monotonic() - imported}
    phases.update({name: sum(compilation_time_metrics[timer]) for timer, name in BUILD_TIMERS.items()
                   if compilation_time_metrics.get(timer)})
    return phases


def _last_line(done: subprocess.CompletedProcess) -> str:
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
    return tail[0][:300]


def live_constants(model: Any) -> Dict[str, Any]:
    """The model's parameters and buffers by fully qualified name (what the package's constants are called)."""
    return {name: t.detach() for name, t in (*model.named_parameters(), *model.named_buffers())}


def wants_cuda_graph(mode: Optional[str], device: str) -> bool:
    """reduce-overhead on a GPU: the package's run is replayed from a CUDA graph (aoti_graph.py)."""
    return bool(mode) and "reduce-overhead" in mode and device.startswith("cuda")


class Runner:
    """A loaded package bound to live tensors: ``runner(*tensors)`` returns what the model would.

    ``cuda_graph``: the first call captures the run into a CUDA graph and every call replays it
    (aoti_graph.py); a capture that fails is logged once and the package runs without one."""

    def __init__(self, path: str, constants: Mapping[str, Any], device: str, *, cuda_graph: bool = False):
        import torch
        from torch.utils import _pytree as pytree

        index = -1 if device == "cpu" else (torch.device(device).index or 0)
        try:
            self._loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, index)
            fqns = list(self._loader.get_constant_fqns())
            missing = [f for f in fqns if f not in constants]
            if missing:
                raise LoadFailed(f"the package wants constants the model lacks: {missing[:3]}")
            # user_managed: the package reads the model's own tensors, no copy (in-place updates are seen)
            self._loader.load_constants({f: constants[f] for f in fqns}, False, True, True)
            self._out_spec = pytree.treespec_loads(self._loader.get_call_spec()[1])
        except LoadFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - torch raises many types for a package it cannot use
            raise LoadFailed(f"AOTIModelPackageLoader could not load {path}: {type(exc).__name__}: {exc}") from exc
        self._unflatten: Callable = pytree.tree_unflatten
        self.cuda_graph = cuda_graph
        self._graphed: Optional[Callable] = None
        self.capture_seconds: Optional[float] = None
        self.capture_error = ""

    def __call__(self, *args: Any) -> Any:
        if self.cuda_graph:
            if self._graphed is None:
                self._capture(args)
            if self._graphed is not None:
                return self._unflatten(self._graphed(args), self._out_spec)
        return self._unflatten(self._loader.run(list(args)), self._out_spec)

    def _capture(self, args: Sequence[Any]) -> None:
        from .aoti_graph import GraphedRun

        started = time.monotonic()
        try:
            self._graphed = GraphedRun(self._loader.run, args)
        except Exception as exc:  # noqa: BLE001 - without a graph the package still runs, only slower
            self.cuda_graph, self.capture_error = False, f"{type(exc).__name__}: {exc}"
            log.warning("cachesvc compile: the package runs without a CUDA graph: capturing it failed: %s",
                        self.capture_error)
            return
        self.capture_seconds = time.monotonic() - started


def _perturb(model: Any) -> None:
    """Scale every floating parameter and buffer of ``model`` in place by seeded factors in [0.5, 1.5]
    (signs kept: a BatchNorm's running variance stays positive)."""
    import torch

    gen = torch.Generator().manual_seed(18)
    with torch.no_grad():
        for t in (*model.parameters(), *model.buffers()):
            if t.is_floating_point():
                factor = torch.rand(t.shape, generator=gen, dtype=torch.float32) + 0.5
                t.mul_(factor.to(device=t.device, dtype=t.dtype))


def tolerance(dtype: Any, device: str = "cpu") -> float:
    """How close a package's outputs must be to eager's, relative to the outputs' scale (``close``)."""
    import torch

    if device != "cpu" and dtype == torch.float32 and (torch.backends.cudnn.allow_tf32
                                                       or torch.backends.cuda.matmul.allow_tf32):
        # TF32 (cuDNN's default for convolutions): on the weights verify perturbs, ResNet-50's outputs reach
        # 5128 on the H200, eager's own TF32 noise (against full float32) is 3.19 and the package's distance
        # from eager 1.28, 2.5e-4 of the scale (docs/gpu.md, run 15); a wrong package is off by the scale
        return 1e-2
    return {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dtype, 1e-3)


def close(got: Any, want: Any, device: str) -> None:
    """Raise AssertionError unless ``got`` is within ``tolerance`` of ``want``: relatively, and absolutely
    by that fraction of the largest magnitude in ``want`` (at least 1), so an element near zero in a
    large output is held to the output's precision, not its own."""
    import torch

    tol = tolerance(want.dtype, device)
    scale = max(1.0, float(want.abs().max())) if want.numel() and want.is_floating_point() else 1.0
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale)


def verify(path: str, model: Any, example_inputs: Sequence[Any], device: str, *, cuda_graph: bool = False,
           timeout: float = 300) -> None:
    """Run the built package in a child process, as a fresh hit would, and compare it with eager; raise on a
    difference or a crash. A child: a loader that dies (torch 2.11's did on the H200) takes only the child.

    Both run on weights the package was not built with (every floating parameter and buffer scaled
    elementwise by a seeded factor in [0.5, 1.5]): a hit runs on whatever weights its process has,
    so a package that kept any of the builder's values (an inlined constant, a folded one) must fail
    here, not in production. ``cuda_graph``: the child captures the run into a CUDA graph and what it
    compares is a replay, on weights changed after the capture (a hit's graph must read the live ones)."""
    import torch
    from torch.utils import _pytree as pytree

    twin = copy.deepcopy(model)
    _perturb(twin)
    with torch.no_grad():
        want = pytree.tree_leaves(twin(*example_inputs))
    with tempfile.TemporaryDirectory(prefix="cachesvc-aoti-check-") as tmp:
        given, back = os.path.join(tmp, "given.pt"), os.path.join(tmp, "back.pt")
        torch.save({"constants": live_constants(twin), "inputs": list(example_inputs)}, given)
        done = subprocess.run([sys.executable, "-m", f"{__package__}.aoti_child", "check", path, given, back, device,
                               "graph" if cuda_graph else ""], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise LoadFailed(f"the package failed in a fresh process (exit {done.returncode}): {_last_line(done)}")
        got = torch.load(back, map_location="cpu")
    if len(got) != len(want):
        raise LoadFailed(f"the package returned {len(got)} outputs; eager {len(want)}")
    for g, w in zip(got, want):
        try:
            close(g, w.cpu(), device)
        except AssertionError as exc:
            detail = " ".join(str(exc).split())[:300]
            raise LoadFailed(f"the package does not reproduce eager on weights it was not built with: {detail}") from None
