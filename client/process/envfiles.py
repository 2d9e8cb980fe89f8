"""The environment fingerprint read from files, without importing torch or triton.

``fingerprint.environment()`` imports torch (1-2 s, longer with CUDA) to read
its version, CUDA build and device. A restore that should start before
``import torch`` (and overlap it) gets the same fields here instead:

    torch    ``__version__`` in torch/version.py (what ``torch.__version__`` is made from)
    triton   ``__version__`` in triton/__init__.py, "none" when triton is not installed
    cuda     ``cuda`` / ``hip`` in torch/version.py, as "cuda-12.8" / "hip-6.2" / "none"
    python   sys.version_info (torch not installed: "none" and the /proc/cpuinfo ISA, as
             ``fingerprint.environment()`` answers then)
    device   a CPU build, or no NVIDIA GPU (/proc/driver/nvidia/gpus): platform.machine();
             a CUDA build with GPUs: their name from ``nvidia-smi``
    arch     CPU: torch's CPU capability rule on the /proc/cpuinfo flags (x86-64:
             avx512 = avx512vl+bw+dq and fma, avx2 = avx2 and fma, else default);
             GPU: ``sm_<compute capability>`` from ``nvidia-smi``

Where these files cannot say for sure what torch would answer, ``environment()``
returns None and the caller uses ``fingerprint.environment()``: ROCm builds,
CPUs other than x86-64, ``ATEN_CPU_CAPABILITY`` set, ``CUDA_VISIBLE_DEVICES``
set, GPUs of more than one kind, MIG, or no nvidia-smi. ``CACHESVC_ENV_<FIELD>``
overrides apply as in ``fingerprint.environment()``.
tests/client/test_fingerprint.py checks that both give the same key.
Stdlib only.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import platform
import subprocess
from typing import Dict, Optional

from .. import settings
from .fingerprint import FIELDS, _cpuinfo_flags, _cpuinfo_isa, _major_minor, _python


class _Unsure(Exception):
    """This field needs torch itself."""


def _assignments(path: str) -> Dict[str, object]:
    """Top-level ``NAME = <literal>`` (or annotated) assignments of a Python file, without running it."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out: Dict[str, object] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(
            node, "target", None) if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and node.value is not None:
            try:
                out[target.id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


def _package_file(package: str, name: str) -> Optional[str]:
    """Path of ``name`` inside an installed top-level ``package`` (found, not imported), or None."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return os.path.join(locations[0], name) if locations else None


def _torch_build() -> Dict[str, object]:
    path = _package_file("torch", "version.py")
    if path is None:
        return {"__version__": "none", "cuda": None, "hip": None}
    try:
        found = _assignments(path)
    except (OSError, SyntaxError) as exc:
        raise _Unsure(f"torch/version.py: {exc}") from None
    if not isinstance(found.get("__version__"), str):
        raise _Unsure("torch/version.py has no literal __version__")
    return found


def _triton_version() -> str:
    path = _package_file("triton", "__init__.py")
    if path is None:
        return "none"
    try:
        version = _assignments(path).get("__version__")
    except (OSError, SyntaxError) as exc:
        raise _Unsure(f"triton/__init__.py: {exc}") from None
    if not isinstance(version, str):
        raise _Unsure("triton/__init__.py has no literal __version__")
    return version


def _cpu_arch() -> str:
    if platform.machine() not in ("x86_64", "AMD64") or os.environ.get("ATEN_CPU_CAPABILITY"):
        raise _Unsure("torch's CPU capability rule is mirrored for x86-64 without ATEN_CPU_CAPABILITY only")
    flags = _cpuinfo_flags()
    if not flags:
        raise _Unsure("no CPU flags in /proc/cpuinfo")
    if {"avx512vl", "avx512bw", "avx512dq", "fma"} <= flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "default"


def _nvidia_gpus() -> bool:
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return False


def _gpu() -> tuple:
    """(name, "sm_XY") of the GPUs torch would see, when all are of one kind."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        raise _Unsure("CUDA_VISIBLE_DEVICES is set")
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,mig.mode.current",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise _Unsure(f"nvidia-smi: {exc}") from None
    rows = {tuple(part.strip() for part in line.split(",")) for line in out.splitlines() if line.strip()}
    if len(rows) != 1:
        raise _Unsure(f"GPUs of {len(rows)} kinds")
    (row,) = rows
    if len(row) != 3 or row[2] == "Enabled" or "." not in row[1]:
        raise _Unsure(f"nvidia-smi said {row}")
    major, minor = row[1].split(".", 1)
    return row[0], f"sm_{major}{minor}"


def _probe(field: str, build: Dict[str, object]) -> str:
    if field == "torch":
        return str(build["__version__"])
    if field == "triton":
        return _triton_version()
    if field == "python":
        return _python()
    if build.get("hip"):
        raise _Unsure("ROCm build")
    if field == "cuda":
        return f"cuda-{_major_minor(str(build['cuda']))}" if build.get("cuda") else "none"
    on_gpu = bool(build.get("cuda")) and _nvidia_gpus()
    if field == "device":
        return _gpu()[0] if on_gpu else (platform.machine() or "unknown")
    if build["__version__"] == "none":
        return _cpuinfo_isa()  # what fingerprint.environment() falls back to without torch
    return _gpu()[1] if on_gpu else _cpu_arch()  # arch


def environment() -> Optional[Dict[str, str]]:
    """``fingerprint.environment()``'s answer without importing torch, or None when only torch can tell."""
    env: Dict[str, str] = {}
    try:
        build: Dict[str, object] = {}
        overrides = settings.current().env_overrides
        for field in FIELDS:
            override = overrides.get(field)
            if override:
                env[field] = override
                continue
            if not build:
                build = _torch_build()
            env[field] = _probe(field, build) or "unknown"
    except _Unsure:
        return None
    return env
