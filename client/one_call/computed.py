"""Tensors the model's own computation makes, carried inside the package: the weights stay out of it.

A forward may make a tensor from Python values: Gemma's ``torch.tensor(hidden_size ** 0.5)`` on
transformers 4.57, a table built from the config. torch.export lifts such a tensor into the program as a
constant, and AOTInductor, building without weights (build.py), asks the loader for it by a name of its
own (``_tensor_constant0``), which no parameter or buffer of the live model has: the package could not
be loaded (runner.py), and the model got no package at all.

Such a tensor is a value of the computation, not state: torch.compile traces the same ``torch.tensor``
call as an operation on Python constants, and its guards pin those constants (the config value), so the
proof refuses a process where they differ. So where the proof says the trace read no tensor outside the
model's parameters, buffers and the call (``proof.Built.reads_inputs``: a tensor held in a plain attribute
or a global is the live process's, and its build-time value must not be carried), the build is asked to
carry them (build.py ``carry``): a scalar becomes a constant in the kernels' code, as Inductor makes it by
default (a CPU scalar beside CUDA tensors cannot be a Triton kernel's pointer argument: the build of
Gemma on the H100 failed so), and the rest are recorded as Inductor reads them (``recording``), left
beside the package by the child (``save``) and put into its zip by the publisher (``attach``). The check
that runs the package on other weights before it is published (verify.py) runs with them too.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import zipfile
from typing import Any, Dict, Iterator, Set

from ..errors import LoadFailed

#: where they travel inside the package (torch's loader reads only its own entries)
ENTRY = "cachesvc/computed-constants.pt"
#: the names AOTInductor gives the tensors a traced program holds that are not its inputs
NAME = re.compile(r"_tensor_constant\d+\Z")
#: larger is not read: these are scalars and small tables, and a package's bytes are untrusted
MAX_BYTES = 64 * 1024 * 1024


def sidecar(package: str) -> str:
    """Where the build child leaves them for the publisher."""
    return package + ".computed"


@contextlib.contextmanager
def recording(weights: Set[str]) -> Iterator[Dict[str, Any]]:
    """While Inductor lowers, take every tensor it reads under a ``NAME`` that is not in ``weights`` (the
    program's parameters and buffers): a scalar into the code, the rest recorded (name -> a CPU copy).
    Wraps GraphLowering.get_attr, where Inductor reads each of the graph's tensors once; nothing else of
    the lowering changes."""
    from torch._inductor import config as inductor_config
    from torch._inductor import graph as inductor_graph

    seen: Dict[str, Any] = {}
    lowering = inductor_graph.GraphLowering
    original = lowering.get_attr

    def get_attr(self: Any, target: str, *args: Any, **kwargs: Any) -> Any:
        if isinstance(target, str) and NAME.match(target) and target not in weights:
            value = inductor_graph.getattr_recursive(self.module, target)
            if _is_plain_tensor(value) and value.dim() == 0:
                with inductor_config.patch(always_keep_tensor_constants=False):
                    return original(self, target, *args, **kwargs)
            if _is_plain_tensor(value):
                seen[target] = value.detach().to("cpu", copy=True)
        return original(self, target, *args, **kwargs)

    lowering.get_attr = get_attr
    try:
        yield seen
    finally:
        lowering.get_attr = original


def _is_plain_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and type(value) in (torch.Tensor, torch.nn.Parameter)


def save(package: str, seen: Dict[str, Any]) -> None:
    """Leave ``seen`` beside ``package`` for the publisher (nothing when there is none)."""
    import torch

    if seen:
        torch.save(dict(seen), sidecar(package))


def attach(package: str) -> int:
    """Put the build's computed tensors into ``package``'s zip; the number put (0: the build left none)."""
    path = sidecar(package)
    if not os.path.exists(path):
        return 0
    with open(path, "rb") as f:
        data = f.read()
    with zipfile.ZipFile(package, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(ENTRY, data)
    return len(_decode(data, "cpu"))


def read(package: str, device: str) -> Dict[str, Any]:
    """The computed tensors ``package`` carries, on ``device`` (empty when it carries none). LoadFailed when
    the entry is damaged, too large, or holds anything but tensors under AOTInductor's constant names."""
    try:
        with zipfile.ZipFile(package) as archive:
            try:
                info = archive.getinfo(ENTRY)
            except KeyError:
                return {}
            if info.file_size > MAX_BYTES:
                raise LoadFailed(f"the package's computed constants are {info.file_size} bytes, over {MAX_BYTES}")
            data = archive.read(info)
    except (OSError, zipfile.BadZipFile, ValueError, RuntimeError) as exc:
        raise LoadFailed(f"the package's computed constants could not be read: {exc}") from exc
    return _decode(data, device)


def _decode(data: bytes, device: str) -> Dict[str, Any]:
    import torch

    try:  # weights_only: tensors and plain containers, nothing that runs code
        loaded = torch.load(io.BytesIO(data), map_location=device, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for bytes it cannot read
        raise LoadFailed(f"the package's computed constants could not be read: {type(exc).__name__}: {exc}") from exc
    if not isinstance(loaded, dict) or not all(
            isinstance(k, str) and NAME.match(k) and isinstance(v, torch.Tensor) for k, v in loaded.items()):
        raise LoadFailed("the package's computed constants are not tensors under AOTInductor's constant names")
    return loaded
