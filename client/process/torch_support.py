"""What this process's torch can make and load: the one-file kinds' probes.

They look for the APIs, never at version numbers (torch 2.11 and 2.13 differ in what exists), and
import torch only when called. ``support`` says why not (naming what is missing); ``require`` raises
``Unsupported`` with that reason and the way out (the directory snapshot, which every torch supports).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ..errors import Unsupported
from ..shared import keys


def _missing(obj: Any, names: Sequence[str], prefix: str) -> list:
    return [f"{prefix}.{n}" for n in names if not hasattr(obj, n)]


def support(kind: str) -> Optional[str]:
    """None when this process's torch can save and load ``kind``; else the reason, naming what is missing."""
    keys.check_kind(kind)
    try:
        import torch
    except ImportError:
        return "torch is not importable in this process"
    if kind == "inductor-dir":
        return None
    if kind == "mega-cache":
        missing = _missing(torch.compiler, ("save_cache_artifacts", "load_cache_artifacts"), "torch.compiler")
    elif kind == "aot-function":
        import torch._dynamo

        missing = _missing(torch.compiler, ("load_compiled_function",), "torch.compiler")
        missing += _missing(torch._dynamo.config, ("enable_aot_compile",), "torch._dynamo.config")
    else:
        import torch._inductor
        import torch.export

        missing = _missing(torch._inductor, ("aoti_compile_and_package", "aoti_load_package"), "torch._inductor")
        missing += _missing(torch.export, ("export",), "torch.export")
    if missing:
        return f"torch {torch.__version__} has no {', '.join(missing)}, which {kind} artifacts need"
    return None


def require(kind: str) -> None:
    """Raise Unsupported unless this process's torch can save and load ``kind``."""
    why = support(kind)
    if why:
        raise Unsupported(f"{why}; use kind inductor-dir (the directory snapshot), which every torch supports")
