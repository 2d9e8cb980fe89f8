"""Build: the weightless package made from the exported program, in a child process (child.py).

``aoti_compile_and_package`` with ``aot_inductor.package_constants_in_so=False``: the package holds
the compiled kernels and the wrapper (about 1.5 MB for the bench mlp), not the weights; the wrapper
is linked with its own C++ runtime (process/cxx.py).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import subprocess
import sys
import time
from typing import Dict, Optional, Sequence

from . import computed
from ..process import cxx as cxx_mod
from ..errors import LoadFailed


#: Inductor's own timers (torch._dynamo.utils.compilation_time_metrics) that say where a build's
#: seconds go, under the names the publish report gives them. They nest: the kernels' and the
#: wrapper's C++ compiles and the precompiled header are inside ``codegen`` or ``wrapper_compile``.
BUILD_TIMERS = {
    "GraphLowering.run": "lowering",
    "Scheduler.codegen": "codegen",  # kernels generated and compiled (Triton or C++), configs picked
    "AotCodeCompiler.compile": "wrapper_compile",  # the C++ wrapper compiled and linked into the .so
    # inside wrapper_compile; off (cxx.inductor_options says why), so a build shows it only
    # where a torch precompiles the headers anyway
    "aoti_precompile_header": "precompiled_header",
}


def build(exported: str, path: str, *, mode: Optional[str], imports: Sequence[str] = (), carry: bool = False,
          timeout: float = 1800) -> Dict[str, float]:
    """Build the weightless package at ``path`` (.pt2) from the program ``export`` saved, in a child process.
    ``imports``: the modules that define the program's pytree types (export.py says why the child needs them).
    ``carry``: the tensors the computation makes may be carried (computed.py; the caller's proof decides).
    Returns where the build's seconds went (``build_here``'s phases; empty when the child did not say).

    A child: Inductor's code generation is minutes of Python that would hold the GIL from the serving
    thread and patch process-wide config and fx state under it; a compiler or a build that crashes
    takes only the child."""
    done = subprocess.run([sys.executable, "-m", f"{__package__}.child", "build", exported, path, mode or "",
                           ",".join(imports), "carry" if carry else ""],
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise LoadFailed(f"building the package failed (exit {done.returncode}): {last_line(done)}")
    return _phases(done.stdout)


def _phases(stdout: str) -> Dict[str, float]:
    """The child's last stdout line, ``{"build_phases": {...}}``; anything else (a torch that printed
    after it, a timer missing) leaves the phases out, never the package."""
    try:
        phases = json.loads(stdout.strip().splitlines()[-1])["build_phases"]
        return {str(k): round(float(v), 3) for k, v in phases.items()}
    except (IndexError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def build_here(exported: str, path: str, mode: Optional[str], imports: Sequence[str] = (),
               carry: bool = False) -> Dict[str, float]:
    """The child's part of ``build``; returns its phases in seconds: ``imports`` (torch, Inductor's config
    and the compiler wrapper's set-up, up to the build), ``package`` (``aoti_compile_and_package`` as a whole) and Inductor's own timers (``BUILD_TIMERS``).
    The wrapper is linked with its own C++ runtime (process/cxx.py says why); where that cannot be done no
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
    with cxx_mod.self_contained_compiler() as (cxx, why_not):
        if cxx is None:
            raise LoadFailed(f"no self-contained package can be built here: {why_not}")
        options.update(cxx_mod.inductor_options(cxx))
        for module in imports:  # the parent's own modules (export.spec_modules), never the network's
            importlib.import_module(module)
        imported = time.monotonic()
        program = torch.export.load(exported)
        if has_depthwise_conv(program):
            options["layout_optimization"] = False
        weights = {*program.graph_signature.parameters, *program.graph_signature.buffers}
        made = computed.recording(weights) if carry else contextlib.nullcontext({})
        with torch.no_grad(), inductor_config.patch(options), made as seen:
            torch._inductor.aoti_compile_and_package(program, package_path=path)
        computed.save(path, seen)  # beside the package: the publisher puts them into it (computed.attach)
    phases = {"imports": imported - started, "package": time.monotonic() - imported}
    phases.update({name: sum(compilation_time_metrics[timer]) for timer, name in BUILD_TIMERS.items()
                   if compilation_time_metrics.get(timer)})
    return phases


def has_depthwise_conv(program) -> bool:
    """Whether the exported program has a depthwise convolution (one input channel per group), a reason
    to build the package without Inductor's layout optimization.

    That optimization runs convolutions channels-last. cuDNN has no precompiled channels-last fp32
    depthwise kernel: at its first use in a process it compiles one at run time for each new shape
    (``conv2d_c1_k1_nhwc``). For the package that was torch.profiler's whole first run on the H200:
    efficientnet_b0's 3.5 s, 13 shapes at 160-370 ms each, against 0.3-0.9 s for the same
    convolutions in eager's NCHW, whose kernels are precompiled. A hit's first call is a
    restarted process's first output, so the package keeps the model's own layout."""
    import torch

    aten = torch.ops.aten
    # where each convolution op takes ``groups`` (exported programs keep conv2d; decomposed ones convolution)
    groups_at = {aten.conv1d.default: 6, aten.conv2d.default: 6, aten.conv3d.default: 6, aten.convolution.default: 8}
    for node in program.graph.nodes:
        at = groups_at.get(node.target) if node.op == "call_function" else None
        if at is None:
            continue
        groups = node.args[at] if len(node.args) > at else node.kwargs.get("groups", 1)
        weight = node.args[1].meta.get("val") if hasattr(node.args[1], "meta") else None
        if isinstance(groups, int) and groups > 1 and weight is not None and weight.dim() > 2 and weight.shape[1] == 1:
            return True
    return False


def last_line(done: subprocess.CompletedProcess) -> str:
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
    return tail[0][:300]
