"""The one-file kinds beyond the directory snapshot (Mega-Cache blobs, precompiled functions and packages):
their files, and making and loading them with torch.

A version of one of these kinds holds one file under the root role ``artifact``:

    mega-cache    mega-cache.bin  torch.compiler.save_cache_artifacts(); loaded back with load_cache_artifacts()
    aot-function  function.aot    torch.compile(fn, fullgraph=True).aot_compile(...), save_compiled_function();
                                  loaded with torch.compiler.load_compiled_function()
    pt2-package   model.pt2       torch.export + torch._inductor.aoti_compile_and_package();
                                  loaded with torch._inductor.aoti_load_package()

and metadata (``Version.meta``): the torch version that made it, the input
signature (``shape_signature`` of the example inputs) and the device. Its
publish is ``publish.onefile``, its fetch (into ``<inductor cache dir>/.cachesvc/
artifacts/<kind>/<version id>/``) ``restore.onefile``, the errors
``Unsupported`` and ``LoadFailed`` are in ``errors``. Only the make and load
functions import torch, and they find out what it offers by looking for the
APIs (``process.torch_support``), not by reading version numbers: torch 2.11
and 2.13 differ in what exists.

Trust: these files are pickles and machine code, as are the snapshot's
``.so`` files. The loaders check integrity, kind, torch version, device and
the APIs; they cannot make a file from an untrusted publisher safe. Give
write tokens only to your own builds, and have a fleet that runs them require
signatures (``CACHESVC_TRUSTED_KEYS``, ``cachesvc_client.shared.signing``): the fetch
refuses an unsigned or wrongly signed version before placing its file.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from .errors import CacheClientError, LoadFailed, Unsupported
from .process.cxx import inductor_options, self_contained_compiler
from .process.fingerprint import shape_signature
from .process.torch_support import require
from .report import RestoreReport

ROLE = "artifact"
FILENAMES = {"mega-cache": "mega-cache.bin", "aot-function": "function.aot", "pt2-package": "model.pt2"}
PRECOMPILED = ("aot-function", "pt2-package")
MAX_META = 1000  # the service's limit on one metadata value


def artifact_counts(info: Any) -> Dict[str, int]:
    """A torch.compiler CacheInfo as {artifact type: count} (empty for None)."""
    artifacts = getattr(info, "artifacts", None) or {}
    return {str(t): len(v) for t, v in artifacts.items() if v}


def artifact_meta(kind: str, example_inputs: Sequence[Any] = (), device: str = "") -> Dict[str, str]:
    """The metadata a version of ``kind`` carries: torch version, input signature, device."""
    import torch

    meta = {"torch": torch.__version__, "artifact": FILENAMES[kind]}
    if example_inputs:
        signature = shape_signature(*example_inputs)
        if len(signature) > MAX_META:
            raise CacheClientError(f"the input signature is {len(signature)} characters; the service keeps "
                                   f"{MAX_META}: publish with fewer example inputs", code="invalid_request")
        meta["signature"] = signature
    if device:
        meta["device"] = device
    return meta


# -- making artifacts (torch) ------------------------------------------------------------------------


def save_mega_cache() -> Tuple[bytes, Dict[str, int]]:
    """torch.compiler.save_cache_artifacts(): the bytes and what they hold. Raises when there is nothing."""
    require("mega-cache")
    import torch

    saved = torch.compiler.save_cache_artifacts()
    if not saved or not saved[0]:
        raise CacheClientError("torch.compiler.save_cache_artifacts() returned nothing: compile in this process "
                               "first, with Inductor's caches on", code="empty")
    return saved[0], artifact_counts(saved[1])


def precompile_function(fn: Callable, example_inputs: Sequence[Any], path: str, **compile_kwargs: Any) -> Callable:
    """Compile ``fn`` ahead of time for ``example_inputs`` and save it to ``path``; return the compiled function.

    ``torch.compile(fn, fullgraph=True, **compile_kwargs).aot_compile(...)``: no graph breaks allowed.
    Pass a module as an argument (``def forward(model, x): return model(x)``) so its weights stay
    out of the file.
    """
    require("aot-function")
    import torch

    with torch._dynamo.config.patch(enable_aot_compile=True):
        compiled = torch.compile(fn, fullgraph=True, **compile_kwargs)
        if not hasattr(compiled, "aot_compile"):
            raise Unsupported(f"torch {torch.__version__}: torch.compile(...) has no aot_compile; "
                              "use kind mega-cache or inductor-dir")
        aot = compiled.aot_compile((tuple(example_inputs), {}))
    aot.save_compiled_function(path)
    return aot


def precompile_package(model: Any, example_inputs: Sequence[Any], path: str) -> str:
    """torch.export ``model`` for ``example_inputs`` and build an AOTInductor package at ``path`` (weights inside).

    ``path`` must end in ``.pt2`` (AOTInductor's rule). Returns the path. The wrapper is linked with its
    own C++ runtime where the compiler can (process/cxx.py says why: otherwise a compiler newer than the
    loading process's libstdc++ makes the loader crash); elsewhere it is built as Inductor builds it.
    """
    require("pt2-package")
    import torch
    import torch._inductor.config as inductor_config

    exported = torch.export.export(model, tuple(example_inputs))
    with self_contained_compiler() as (cxx, why_not):
        with inductor_config.patch(inductor_options(cxx)):
            return torch._inductor.aoti_compile_and_package(exported, package_path=path)


# -- loading artifacts (torch) -----------------------------------------------------------------------


def load_mega_cache(path: str) -> Dict[str, int]:
    """torch.compiler.load_cache_artifacts() of the blob at ``path``; return what it loaded, per artifact type."""
    require("mega-cache")
    import torch

    with open(path, "rb") as f:
        data = f.read()
    try:
        info = torch.compiler.load_cache_artifacts(data)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a blob it cannot read
        raise LoadFailed(f"torch.compiler.load_cache_artifacts refused {path}: {type(exc).__name__}: {exc}; "
                         "publish a Mega-Cache from this torch version") from exc
    if info is None:  # torch logs why (a corrupt blob, or one another torch wrote) and returns None
        raise LoadFailed(f"torch.compiler.load_cache_artifacts refused {path} (torch's log says why): "
                         "publish a Mega-Cache from this torch version")
    return artifact_counts(info)


def _check_made_here(kind: str, meta: Dict[str, str], path: str) -> None:
    import torch

    made_by = meta.get("torch")
    if made_by and made_by != torch.__version__:
        raise Unsupported(f"{path} was made by torch {made_by}; this process has torch {torch.__version__}, and "
                          f"{kind} artifacts load only in the torch that made them: precompile with this torch")
    device = meta.get("device", "")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise Unsupported(f"{path} was compiled for {device}, and this process has no CUDA device")


def load_precompiled(artifact: Any, kind: Optional[str] = None, meta: Optional[Dict[str, str]] = None,
                     f_globals: Optional[Dict[str, Any]] = None) -> Callable:
    """Load a precompiled artifact; return the callable.

    ``artifact`` is the RestoreReport of ``CacheClient.restore(kind='aot-function' | 'pt2-package')`` (its
    file, kind and metadata are used) or a path, with ``kind`` and optionally ``meta``.
    aot-function: call the result with the arguments the function was compiled for (Dynamo does not run;
    torch's guards check the inputs). pt2-package: call it with the exported inputs.

    Raises Unsupported (torch here lacks the API, is another version than the one that made the file, or
    the file wants a device this process lacks) and LoadFailed (torch raised on load).

    On the CPU, the first load in a fresh container still compiles Inductor's vector-ISA probes
    (five small C++ programs, into the Inductor cache dir) and, for aot-function, the function's C++
    kernels; a restore of the key's inductor-dir snapshot as well brings those back.
    """
    if isinstance(artifact, RestoreReport):
        if not artifact.hit or not artifact.artifacts:
            raise CacheClientError(f"nothing to load: {artifact.summary()}", code="miss")
        kind, meta, path = artifact.kind, {**artifact.meta, **(meta or {})}, artifact.artifacts[0]
    else:
        path = os.fspath(artifact)
    if kind not in PRECOMPILED:
        raise ValueError(f"kind must be one of {', '.join(PRECOMPILED)}, got {kind!r}")
    require(kind)
    _check_made_here(kind, meta or {}, path)
    import torch

    try:
        if kind == "aot-function":
            with open(path, "rb") as f:
                return torch.compiler.load_compiled_function(f, f_globals=f_globals)
        return torch._inductor.aoti_load_package(path)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a file it cannot read
        raise LoadFailed(f"torch could not load the {kind} artifact {path}: {type(exc).__name__}: {exc}") from exc
