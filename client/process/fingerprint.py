"""Environment fingerprint and shape signature: the parts of a cache key the client computes.

Stdlib only, Python 3.9+. torch and triton are imported lazily, inside the
functions, and only for fields that are not overridden, so this module
imports (and ``environment()`` works) in a container without them.
"""
from __future__ import annotations

import importlib.util
import os
import platform
import re
import sys
from typing import Any, Callable, Dict, List, Optional

#: Fields of ``environment()``, in order (same as keys.ENV_FIELDS).
FIELDS = ("torch", "triton", "cuda", "python", "device", "arch")

#: ``CACHESVC_ENV_<FIELD>`` overrides a field (e.g. CACHESVC_ENV_DEVICE=H100). The one client variable read
#: outside ``settings``: this file also runs on its own, loaded by path in a Python without the package
#: (tests/client/test_fingerprint.py), so it imports nothing of the client; ``settings.env_overrides``
#: applies the same rule (set and non-empty) for every other reader.
OVERRIDE_PREFIX = "CACHESVC_ENV_"


def _torch() -> Any:
    """The torch module, or None when it is not installed (imported on first need; a repeated failed import
    is cheap: the import system caches the folders it searched)."""
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return None
    return torch


def _cuda_available(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver must not break the fingerprint
        return False


def _major_minor(version: str) -> str:
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{m.group(1)}.{m.group(2)}" if m else version


def _torch_version() -> str:
    torch = _torch()
    return str(torch.__version__) if torch is not None else "none"


def _triton_version() -> str:
    """triton's version, read from its installed distribution's metadata when there is one: importing
    triton (what a CUDA build of torch brings along) costs a process that loads a precompiled package, and
    needs neither Dynamo nor Inductor, its own import time. Imported only when no ``triton`` distribution
    names it (a source checkout or a vendor's renamed build)."""
    if importlib.util.find_spec("triton") is None:
        return "none"
    try:
        from importlib import metadata  # noqa: PLC0415
        return metadata.version("triton")
    except Exception:  # no such distribution, or unreadable metadata: ask the module itself
        pass
    try:
        import triton  # noqa: PLC0415
    except ImportError:
        return "none"
    return str(getattr(triton, "__version__", "none"))


def _cuda() -> str:
    torch = _torch()
    if torch is None:
        return "none"
    version = getattr(torch, "version", None)
    cuda = getattr(version, "cuda", None)
    if cuda:
        return f"cuda-{_major_minor(str(cuda))}"
    hip = getattr(version, "hip", None)
    if hip:
        return f"hip-{_major_minor(str(hip))}"  # "6.2.41133-dd7f95766" -> "hip-6.2"
    return "none"


def _python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def _device() -> str:
    torch = _torch()
    if torch is not None and _cuda_available(torch):
        return str(torch.cuda.get_device_name(0))
    return platform.machine() or "unknown"


def _cpuinfo_flags(path: str = "/proc/cpuinfo") -> set:
    """The CPU flags in /proc/cpuinfo (x86 "flags", arm64 "Features"); empty when unreadable."""
    flags: set = set()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("flags", "features"):
                    flags.update(value.split())
    except OSError:
        pass
    return flags


def _cpuinfo_isa(path: str = "/proc/cpuinfo") -> str:
    """Best vector ISA from the CPU flags in /proc/cpuinfo, or "unknown"."""
    flags = _cpuinfo_flags(path)
    for flag, isa in (("avx512f", "avx512"), ("avx2", "avx2"), ("sve", "sve"), ("asimd", "neon"), ("neon", "neon")):
        if flag in flags:
            return isa
    return "unknown"


def _arch() -> str:
    torch = _torch()
    if torch is not None and _cuda_available(torch):
        if getattr(torch.version, "hip", None):
            arch = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")
            if arch:
                return arch.split(":")[0]  # "gfx942:sramecc+:xnack-" -> "gfx942"
        major, minor = torch.cuda.get_device_capability(0)
        return f"sm_{major}{minor}"
    if torch is not None:
        get_cap = getattr(getattr(getattr(torch, "backends", None), "cpu", None), "get_cpu_capability", None)
        if callable(get_cap):
            try:
                cap = get_cap()
            except Exception:
                cap = None
            if cap:
                return str(cap).lower()  # "AVX512", "AVX2", "DEFAULT", "SVE256", ...
    return _cpuinfo_isa()


_PROBES: Dict[str, Callable[[], str]] = {
    "torch": _torch_version,
    "triton": _triton_version,
    "cuda": _cuda,
    "python": _python,
    "device": _device,
    "arch": _arch,
}


def environment() -> Dict[str, str]:
    """The environment fingerprint: every field of ``FIELDS`` as a string.

    ``torch``: torch.__version__ or "none"; ``triton``: triton.__version__ or
    "none"; ``cuda``: "cuda-12.8" / "hip-6.2" / "none"; ``python``: "3.11";
    ``device``: the GPU name (torch.cuda.get_device_name(0)) when CUDA is
    available, else the CPU architecture (platform.machine(), e.g. "x86_64");
    ``arch``: "sm_90" on CUDA (gfx name on ROCm), else the CPU's best vector
    ISA lowercased ("avx512", "avx2", "default", ...; from
    torch.backends.cpu.get_cpu_capability(), else /proc/cpuinfo), else "unknown".
    Any field can be forced with $CACHESVC_ENV_<FIELD> (non-empty).
    """
    env: Dict[str, str] = {}
    for field in FIELDS:
        override = os.environ.get(OVERRIDE_PREFIX + field.upper())
        if override:
            env[field] = override
        else:
            try:
                env[field] = _PROBES[field]() or "unknown"
            except Exception:  # noqa: BLE001 - a fingerprint field must never crash the caller
                env[field] = "unknown"
    return env


def torch_dir() -> Optional[str]:
    """Where torch is installed. Inductor's C++ cache keys hold its include paths, so a
    restore into a container with torch elsewhere hits the graph cache but rebuilds kernels."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    return os.path.dirname(spec.origin) if spec and spec.origin else None


# --------------------------------------------------------------------------
# Shape signature
# --------------------------------------------------------------------------

_DTYPE_SHORT = {
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "float64": "f64",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
    "bool": "b8",
    "complex64": "c64",
}


def _dtype_short(dtype: Any) -> str:
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch."):]
    return _DTYPE_SHORT.get(name, name)


def _dim(d: Any) -> str:
    try:
        return str(int(d))
    except (TypeError, ValueError):  # symbolic / unknown sizes
        return str(d)


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def sorted_keys(d: Dict[Any, Any]) -> List[Any]:
    """A dict's keys in the order shape_signature flattens them."""
    try:
        return sorted(d)
    except TypeError:  # mixed key types
        return sorted(d, key=lambda k: (type(k).__name__, repr(k)))


def _flatten(x: Any, prefix: str, out: List[str]) -> None:
    if _is_tensor(x):
        out.append(f"{prefix}{_dtype_short(x.dtype)}[{','.join(_dim(d) for d in x.shape)}]")
    elif isinstance(x, dict):
        for k in sorted_keys(x):
            _flatten(x[k], f"{prefix}{k}=", out)
    elif isinstance(x, (list, tuple)):
        for item in x:
            _flatten(item, prefix, out)
    else:
        out.append(f"{prefix}{type(x).__name__}")  # int, float, bool, str, NoneType, ...


def shape_signature(*example_inputs: Any) -> str:
    """Canonical text of the inputs' dtypes and shapes, e.g. ``f32[8,256],i64[8]``.

    Tensors (anything with ``shape`` and ``dtype``) become ``<dtype>[d0,d1,...]``
    with dtype short names f32 f16 bf16 f64 i64 i32 i16 i8 u8 b8 c64 (others:
    str(dtype) without "torch."); a 0-d tensor is ``f32[]``. Lists and tuples
    are flattened in order; dicts in sorted key order, each leaf under key
    ``k`` prefixed ``k=`` (nested dicts: ``outer=inner=``). Any other value
    shows its type name only (``int``, ``float``, ``bool``, ``str``,
    ``NoneType``), so changing a scalar's value does not change the signature.
    Items are joined by ``,``.
    """
    out: List[str] = []
    for x in example_inputs:
        _flatten(x, "", out)
    return ",".join(out)


__all__ = ["FIELDS", "environment", "shape_signature"]
