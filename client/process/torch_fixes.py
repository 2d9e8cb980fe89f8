"""Workarounds for torch releases whose warm caches still re-tune kernels.

**Coordinate-descent winners forgotten on load (torch <= 2.11).** With
``coordinate_descent_tuning`` on (``mode="max-autotune"`` and
``"max-autotune-no-cudagraphs"``), Inductor's ``.best_config`` files record the
winner of the runtime tuning with ``found_by_coordesc: true``. When a later
process loads a kernel from the FX graph cache,
``CachingAutotuner.recheck_autotune_cache`` reads that file. In torch 2.11,
when the winner is one of the configs compiled ahead of time, it keeps that
config but drops the ``found_by_coordesc`` mark, and it skips kernels
compiled with a single config. ``run()`` then tunes those kernels again at
their first launch: 2 of 10 kernels of the 6-layer encoder on an H200, ~2-3 s
of benchmarking and new Triton compiles, in the floor as in a restored
process (measured with bench/probes/gpu_probe.py). torch 2.13's version of the method
carries the mark over; ``apply()`` installs that behaviour where it is
missing, and does nothing on releases that have it.

The fix is chosen by what the installed code does (its source), not by a
version string, and any surprise leaves torch as it is, with a log line.
Set ``CACHESVC_TORCH_FIXES=0`` to turn it off.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import inspect
import logging
import sys
from typing import Dict

from .. import settings

log = logging.getLogger("cachesvc_client")

_MARK = "found_by_coordesc = found_by_coordesc"  # the line torch 2.13 has and 2.11 lacks


class TorchFixes:
    """What this process did to torch: ``{fix: state}``. torch's classes are process-wide, so a patch is made
    once per process and its state is too: ``FIXES`` is the one instance (as ``remote_cache.HOOKS``)."""

    def __init__(self):
        self.states: Dict[str, str] = {}

    def patch(self, th) -> None:
        """Patch Inductor's Triton runtime module ``th`` (never raises), and log what happened."""
        try:
            self.states["coordesc-mark"] = _patch_recheck(th)
        except Exception as e:  # noqa: BLE001 - a workaround must never break the process
            self.states["coordesc-mark"] = f"not applied: {e.__class__.__name__}: {e}"
        if self.states["coordesc-mark"] == "applied":
            log.info("cachesvc: patched CachingAutotuner.recheck_autotune_cache so cached coordinate-descent "
                     "winners are not tuned again (torch %s)", getattr(sys.modules.get("torch"), "__version__", "?"))
        elif self.states["coordesc-mark"].startswith("not applied"):
            log.warning("cachesvc: %s", self.states["coordesc-mark"])


FIXES = TorchFixes()


def _recheck_autotune_cache(th):
    """torch 2.13's ``recheck_autotune_cache``, for releases whose own drops the coordesc mark."""
    timed = getattr(th, "dynamo_timed", None)

    def recheck_autotune_cache(self, reload_kernel_from_src) -> None:
        configs = [result.config for result in self.compile_results]
        cached_configs, _, autotune_cache_info = th.check_autotune_cache(configs, self.filename,
                                                                          self.inductor_meta)
        self.autotune_cache_info = autotune_cache_info
        if len(cached_configs) != 1:
            return
        best_config = cached_configs[0]
        found_by_coordesc = getattr(best_config, "found_by_coordesc", False)
        best_hash = th.triton_config_to_hashable(best_config)
        for compile_result in self.compile_results:
            if th.triton_config_to_hashable(compile_result.config) == best_hash:
                compile_result.config.found_by_coordesc = found_by_coordesc
                self.compile_results = [compile_result]
                return
        # the winner was found at run time (coordinate descent): compile it now
        with (timed("CachingAutotuner.slow_precompile_config") if timed else contextlib.nullcontext()):
            if self.fn.fn is None:
                self.fn = reload_kernel_from_src().fn
            self.compile_results = [self._precompile_config(best_config)]

    recheck_autotune_cache._cachesvc_fix = True
    return recheck_autotune_cache


_MODULE = "torch._inductor.runtime.triton_heuristics"


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patch Inductor's Triton runtime right after it is imported: no import is paid up front."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _MODULE:
            return None
        sys.meta_path.remove(self)  # once: whatever finds the module from here on is torch's own finder
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            FIXES.patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def apply() -> Dict[str, str]:
    """Install the workarounds torch needs in this process; return ``{fix: state}``.

    Costs nothing up front: if Inductor's Triton runtime is not imported yet,
    the patch waits for its import (a ``sys.meta_path`` hook). Never imports
    torch or Triton itself.
    """
    if not settings.current().torch_fixes:
        return {"coordesc-mark": "disabled by CACHESVC_TORCH_FIXES=0"}
    if "coordesc-mark" in FIXES.states:
        return dict(FIXES.states)
    module = sys.modules.get(_MODULE)
    if module is not None:
        FIXES.patch(module)
        return dict(FIXES.states)
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
    return {"coordesc-mark": "on import of " + _MODULE}


def _patch_recheck(th) -> str:
    tuner = getattr(th, "CachingAutotuner", None)
    method = getattr(tuner, "recheck_autotune_cache", None)
    if method is None:
        return "not applicable: this torch has no recheck_autotune_cache"
    if getattr(method, "_cachesvc_fix", False):
        return "applied"
    try:
        source = inspect.getsource(method)
    except (OSError, TypeError) as e:
        return f"not applied: source unavailable ({e})"
    if _MARK in source:
        return "not needed: this torch keeps the mark"
    missing = [n for n in ("check_autotune_cache", "triton_config_to_hashable") if not hasattr(th, n)]
    if missing:
        return f"not applied: {', '.join(missing)} missing in this torch"
    tuner.recheck_autotune_cache = _recheck_autotune_cache(th)
    return "applied"
