"""Can this torch and this host take the package route: the checks before a build and before a load.

``choose_route`` picks a model's route when ``compile()`` is called (feature-detected, never by
version number); ``check_host`` tells whether a published package can run on this host (its meta
against this process: torch, the CPU's vector ISA, the device, the C++ runtime it was linked with).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from ..process import cxx
from .spec import tensor_inputs
from ..client import REQUIRE_HIT_VAR, require_hit_from_env  # noqa: F401 - the variable is named in compiled.py errors
from .. import settings
from ..errors import CacheClientError
from ..settings import COMPILE_ROUTE_VAR as ROUTE_VAR  # aoti | torch: force a route (benchmarks, debugging)

KIND = "pt2-package"
LOADER_API = ("run", "load_constants", "get_constant_fqns", "get_call_spec")
#: meta value: the package has no weights; the loader is given the live model's
CONSTANTS = "live"
ROUTES = ("aoti", "torch")
#: the snapshot's meta key where the process that compiled a key says why it published no package
PACKAGE_FAILED = "package_failed"
META_CHARS = 1000  # the service's bound on a meta value
#: the package's meta key: each declared dim's range as the package serves it (calls.CallSpec.served_text)
SERVED = "dims"
#: a miss or a fall-back to torch.compile on the declared inputs is an error (CacheClient.restore shares it)


def require_hit(given: Optional[bool]) -> bool:
    """``compile(require_hit=...)`` when given, else ``$CACHESVC_REQUIRE_HIT`` (1, true or yes: on)."""
    if given is not None:
        return bool(given)
    return require_hit_from_env()


def choose_route(example_inputs: Sequence[Any], kwargs: Mapping[str, Any]) -> Tuple[str, str]:
    """(route, why): the best route this torch offers for these inputs and options."""
    forced = settings.current().compile_route
    if forced:
        if forced not in ROUTES:
            raise CacheClientError(f"{ROUTE_VAR}={forced!r}: use one of {', '.join(ROUTES)}", code="invalid_request")
        return forced, f"{ROUTE_VAR}={forced}"
    backend = kwargs.get("backend", "inductor")
    if backend != "inductor":
        return "torch", f"backend {backend!r} (the precompiled route is Inductor's)"
    why = tensor_inputs(example_inputs) or loader_support()
    return ("torch", why) if why else ("aoti", "AOTInductor package + C++ loader")


def package_failed(snapshot: Any) -> str:
    """Why the process that compiled a key published no package, from its snapshot restored here (its meta:
    ``PACKAGE_FAILED``); "" when it did not say or nothing was restored."""
    if snapshot is None or not getattr(snapshot, "hit", False):
        return ""
    return str((snapshot.meta or {}).get(PACKAGE_FAILED) or "")


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
            "route": "aoti", "device": device, "cxx_runtime": cxx.RUNTIME}


def check_host(meta: Dict[str, str], device: str) -> Optional[str]:
    """None when a package with ``meta`` can run here; else why not (the caller falls back)."""
    import torch

    if meta.get("constants") != CONSTANTS or meta.get("route") != "aoti":
        return "the published pt2-package was not made by cachesvc_client.compile"
    if meta.get("cxx_runtime") != cxx.RUNTIME:  # its wrapper uses the builder's C++ runtime: it can crash here
        return "the published pt2-package's wrapper was not linked with its own C++ runtime (an older client built it)"
    if meta.get("torch") != torch.__version__:
        return f"the package was made by torch {meta.get('torch')}; this process has torch {torch.__version__}"
    here = str(torch.backends.cpu.get_cpu_capability())
    if meta.get("cpu_capability") != here:
        return f"the package was built for CPU ISA {meta.get('cpu_capability')}; this CPU offers {here}"
    if meta.get("device") != device:
        return f"the package was built for device {meta.get('device')}; the inputs are on {device}"
    return None


def wants_cuda_graph(mode: Optional[str], device: str) -> bool:
    """reduce-overhead on a GPU: the package's run is replayed from a CUDA graph (graph.py)."""
    return bool(mode) and "reduce-overhead" in mode and device.startswith("cuda")
