"""Version kinds beyond the directory snapshot: Mega-Cache blobs and precompiled functions.

A version of one of these kinds holds one file under the root role ``artifact``:

    mega-cache    mega-cache.bin  torch.compiler.save_cache_artifacts(); loaded back with load_cache_artifacts()
    aot-function  function.aot    torch.compile(fn, fullgraph=True).aot_compile(...), save_compiled_function();
                                  loaded with torch.compiler.load_compiled_function()
    pt2-package   model.pt2       torch.export + torch._inductor.aoti_compile_and_package();
                                  loaded with torch._inductor.aoti_load_package()

and metadata (``Version.meta``): the torch version that made it, the input
signature (``shape_signature`` of the example inputs) and the device. A
restore of these kinds fetches the file, verified by sha256, into

    <inductor cache dir>/.cachesvc/artifacts/<kind>/<version id>/<file>

(``.cachesvc`` is never published). Only the load functions import torch,
and they find out what it offers by looking for the APIs (``support``), not
by reading version numbers: torch 2.11 and 2.13 differ in what exists.

Trust: these files are pickles and machine code, as are the snapshot's
``.so`` files. The loaders check integrity, kind, torch version, device and
the APIs; they cannot make a file from an untrusted publisher safe. Give
write tokens only to your own builds, and have a fleet that runs them require
signatures (``CACHESVC_TRUSTED_KEYS``, ``cachesvc_client.shared.signing``): ``fetch``
refuses an unsigned or wrongly signed version before placing its file.
"""
from __future__ import annotations

import functools
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from .shared import keys, signing
from . import publish as publish_mod
from .process import roots as roots_mod
from .errors import CacheClientError
from .process.fingerprint import shape_signature
from .report import PublishReport, RestoreReport
from .restore import pipeline
from .restore.place import STATE_DIR
from .restore.plan import Plan, check_manifest
from .transport.api import ServiceAPI

ROLE = "artifact"
FILENAMES = {"mega-cache": "mega-cache.bin", "aot-function": "function.aot", "pt2-package": "model.pt2"}
PRECOMPILED = ("aot-function", "pt2-package")
MAX_META = 1000  # the service's limit on one metadata value


class Unsupported(CacheClientError):
    """The torch in this process cannot make or load this artifact; the message says why and what to do."""

    def __init__(self, message: str):
        super().__init__(message, code="unsupported")


class LoadFailed(CacheClientError):
    """torch raised while loading an artifact that passed every check."""

    def __init__(self, message: str):
        super().__init__(message, code="load_failed")


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
    own C++ runtime where the compiler can (one_call/cxx.py says why: otherwise a compiler newer than the
    loading process's libstdc++ makes the loader crash); elsewhere it is built as Inductor builds it.
    """
    require("pt2-package")
    import torch
    import torch._inductor.config as inductor_config

    # here, not at the top: the one call's package imports this module (LoadFailed) as it starts
    from .one_call.cxx import inductor_options, self_contained_compiler

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


# -- publish and fetch (no torch) --------------------------------------------------------------------


def publish_file(api: ServiceAPI, key: dict, kind: str, *, path: str, meta: Dict[str, str],
                 compile_seconds: Optional[float] = None, workers: int = 8) -> PublishReport:
    """Publish the file at ``path`` as the one file of a version of ``kind``."""
    keys.check_kind(kind)
    if kind not in FILENAMES:
        raise ValueError(f"{kind} is a folder snapshot: publish it with CacheClient.publish")
    with tempfile.TemporaryDirectory(prefix="cachesvc-artifact-") as stage:
        staged = os.path.join(stage, FILENAMES[kind])
        try:
            os.link(path, staged)
        except OSError:  # another file system, or links not allowed
            shutil.copyfile(path, staged)
        return publish_mod.publish(api, key, [roots_mod.Root(ROLE, stage)], kind=kind, meta=meta,
                                   compile_seconds=compile_seconds, workers=workers)


def artifact_dir(cache_dir: str, kind: str, version_id: int) -> str:
    inductor = os.path.realpath(roots_mod.resolve_root("inductor", cache_dir))
    return os.path.join(inductor, STATE_DIR, "artifacts", kind, str(version_id))


def fetch(api: ServiceAPI, key: dict, kind: str, *, cache_dir: str, workers: int = 16, timeout: float = 30.0,
          stall_timeout: float = 30.0, budget: Optional[float] = None,
          trust: Optional[signing.Trust] = None) -> RestoreReport:
    """Fetch the newest version of ``kind`` for ``key`` into ``artifact_dir``; the report lists the files.

    The restore's own steps (``restore.pipeline.run``: plan -> fetch -> place), with this kind's plan
    (``_accept``). ``budget``: seconds the whole fetch may take, resolve included, as for the snapshot.
    ``trust``: the signatures required, checked in ``pipeline.run`` as for the snapshot (a precompiled
    package is machine code: the same refusal before any byte is placed).

    Raises CacheClientError subclasses on service or storage trouble (CacheClient.restore turns them
    into a miss unless strict).
    """
    report, plan = pipeline.run(api, key, kind=kind, accept=functools.partial(_accept, kind=kind, cache_dir=cache_dir),
                                workers=workers, timeout=timeout, stall_timeout=stall_timeout, budget=budget,
                                trust=trust)
    if plan is None:
        return report
    dest = plan.local[ROLE]
    mine = [os.path.join(dest, f["path"]) for f in plan.files if f["root"] == ROLE]
    report.hit = bool(mine) and not report.failed
    report.artifacts = mine if report.hit else []
    if not report.hit:
        report.reason = f"the {kind} artifact could not be fetched: {report.failed[0] if report.failed else 'empty'}"
    return report


def _accept(report: RestoreReport, answer: dict, *, kind: str, cache_dir: str) -> Plan:
    """The plan of a one-file kind: its ``artifact`` root's file into ``artifact_dir`` (other roles are left out)."""
    files, version = answer["files"], answer["version"]
    check_manifest(files)
    report.version_id, report.entry_id = version["id"], answer["entry"]["id"]
    report.meta = dict(version["meta"])
    dest = artifact_dir(cache_dir, kind, version["id"])
    os.makedirs(dest, exist_ok=True)
    report.roots = {ROLE: dest}
    local = {f["root"]: (dest if f["root"] == ROLE else None) for f in files}
    local[ROLE] = dest
    return Plan(files, local, dest, f"{dest}.lock")
