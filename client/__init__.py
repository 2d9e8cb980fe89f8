"""cachesvc_client: publish and restore torch.compile state through a cachesvc service.

    from cachesvc_client import CacheClient, shape_signature
    client = CacheClient()                      # CACHESVC_URL, CACHESVC_TOKEN, TORCHINDUCTOR_CACHE_DIR
    client.restore(name="resnet50", shape=shape_signature(x))
    ... torch.compile(model)(x) ...
    client.publish(name="resnet50", shape=shape_signature(x))

    # a process without torch or a GPU (an init container) keys with the app's environment:
    client.restore(name="resnet50", shape="f32[8,3,224,224]", env=cachesvc_client.load_env_file("env.json"))

    model = cachesvc_client.compile(model, (x,), name="resnet50")  # a hit: no Dynamo, no Inductor

    cachesvc_client.enable_remote_cache()       # compiles mid-run ask the fleet first (remote_cache.py)

Needs only requests, zstandard, filelock, click and tqdm; torch is imported
lazily from the container.

This module is the public face and imports nothing itself: each public name is
imported from its module on first use (PEP 562 ``__getattr__``, as
huggingface_hub's ``__init__`` does). So ``import cachesvc_client.shared.keys`` (the
rules the service shares, standard library only) costs the service and a bare
init container no requests, filelock, tqdm or zstandard.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, List

__version__ = "0.1.0"

#: public name -> the module (under this package) that defines it
_PUBLIC: Dict[str, str] = {
    "CacheClient": "client",
    "CacheClientError": "errors",
    "CompiledModel": "one_call",
    "HitRequired": "errors",
    # the function is one_call's door, not a module named compile: importing a submodule sets the
    # package's attribute of that name, and cachesvc_client.compile would then be the module
    # (so neither package has a submodule named compile)
    "compile": "one_call",
    "PublishReport": "report",
    "RestoreReport": "report",
    "apply_torch_fixes": "process.torch_fixes",
    "disable_remote_cache": "remote_cache",
    "enable_remote_cache": "remote_cache",
    "environment": "process.fingerprint",
    "load_env_file": "process.keyenv",
    "load_precompiled": "onefile",
    "precompile_function": "onefile",
    "precompile_package": "onefile",
    "shape_signature": "process.fingerprint",
}
#: names whose attribute in their module is another (``apply_torch_fixes`` is ``torch_fixes.apply``)
_RENAMED = {"apply_torch_fixes": "apply"}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    """Import a public name (or a submodule, ``cachesvc_client.remote_cache``) on first use."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), _RENAMED.get(name, name))
    else:
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise  # the submodule exists and lacks a dependency: say that, not "no attribute"
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_PUBLIC))


if TYPE_CHECKING:  # for type checkers and IDEs; never run
    from .onefile import load_precompiled, precompile_function, precompile_package
    from .client import CacheClient
    from .one_call import CompiledModel, compile  # noqa: A004
    from .errors import CacheClientError, HitRequired
    from .process.fingerprint import environment, shape_signature
    from .process.keyenv import load_env_file
    from .remote_cache import disable_remote_cache, enable_remote_cache
    from .report import PublishReport, RestoreReport
    from .process.torch_fixes import apply as apply_torch_fixes
