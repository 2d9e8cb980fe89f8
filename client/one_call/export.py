"""Export: the model traced by ``torch.export`` for the example call, saved for the build child.

The program goes to the build child through ``torch.export.save``/``load``, and its input and output
structures are pytree specs saved by their type's name. transformers registers its ``ModelOutput``
classes as pytree nodes when they are defined (``transformers.modeling_outputs`` and each model's
module), so a child that has not imported them cannot read the program back: "We ran into an error
when deserializing the saved file" (NotImplementedError: Deserializing
transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions in pytree is not
registered). ``export`` therefore returns the modules that define those types, and the child imports
them before loading (build.py).
"""
from __future__ import annotations

import copy
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from .calls import canonical

#: pytree node types the child knows without an import
BUILTIN_MODULES = ("builtins", "collections", "torch")


def export(model: Any, example_inputs: Sequence[Any], path: str, *, kwargs: Optional[Mapping[str, Any]] = None,
           dynamic_shapes: Any = None) -> Tuple[List[str], str]:
    """``torch.export`` a copy of ``model`` for ``model(*example_inputs, **kwargs)`` and save the program at
    ``path`` (.pt2); return the modules the build child must import to read it (``spec_modules``) and how it
    was exported: ``"non-strict"``, else ``"strict"``.

    Non-strict export first (it runs the model's Python as it is); where it fails, or its program cannot be
    saved, strict export (Dynamo's trace, the proof's own tracer): transformers 4.x decoders build their
    attention mask with ``torch.vmap``, which non-strict export leaves as a ``flat_apply`` node that
    ``torch.export.save`` cannot serialize (``SerializeError: Failed serializing node flat_apply``); strict
    export traces it into plain ops. Raises the first attempt's error when both fail.

    The keyword arguments are passed sorted by name (calls.canonical): the package's inputs are then in
    the order every call is flattened in, whatever order a caller writes them in. ``dynamic_shapes``:
    torch.export's (calls.CallSpec.export_dynamic_shapes). Called in the serving thread, between two
    calls (compiled.py): export sets torch.fx's module-level node metadata, which a compiled call running
    at the same time in another thread also sets, and torch 2.11's compiled ViT-B/16 died of that race
    (KeyError 'custom', then terminate) when export ran in the background thread."""
    failures: List[BaseException] = []
    for strict in (False, True):
        try:
            return _export(model, example_inputs, path, kwargs, dynamic_shapes, strict), \
                "strict" if strict else "non-strict"
        except Exception as exc:  # noqa: BLE001 - the other way may work; both failing raises the first
            failures.append(exc)
    raise failures[0]


def _export(model: Any, example_inputs: Sequence[Any], path: str, kwargs: Optional[Mapping[str, Any]],
            dynamic_shapes: Any, strict: bool) -> List[str]:
    import torch

    twin = copy.deepcopy(model)  # export may patch the module it traces; the process keeps the original
    args, kw = canonical(example_inputs, kwargs)
    with torch.no_grad():
        program = torch.export.export(twin, args, kw, dynamic_shapes=dynamic_shapes, strict=strict)
    torch.export.save(program, path)
    signature = program.module_call_graph[0].signature
    return spec_modules(signature.in_spec, signature.out_spec)


def run_once(model: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """One eager forward of a copy of ``model`` (train mode moves its running statistics), under no grad: what
    the proof records the environment variables from when strict export traced without running the model."""
    import torch

    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin(*args, **kwargs)


def spec_modules(*specs: Any) -> List[str]:
    """The modules that define the node types of these pytree specs, other than Python's and torch's own."""
    found: List[str] = []
    todo = list(specs)
    while todo:
        spec = todo.pop()
        if spec is None:
            continue
        node_type = getattr(spec, "type", None)
        module = getattr(node_type, "__module__", None) or ""
        if module and module.split(".")[0] not in BUILTIN_MODULES and module not in found:
            found.append(module)
        todo.extend(spec.children() if hasattr(spec, "children") else ())
    return sorted(found)


#: where torch.export's messages name the model's line that failed (strict and non-strict export)
WHERE_MARKERS = ("from user code", "The following call raised this error")


def why_failed(exc: BaseException) -> str:
    """One line for a failed export: the error's type and first line, and where: the model's line
    that failed (the frame torch.export's message names, else the innermost frame of the traceback
    outside torch) or the node a serializer names in its first line."""
    lines = str(exc).strip().splitlines()
    first = lines[0].strip()[:300] if lines else ""
    where = ""
    for i, line in enumerate(lines):
        if any(marker in line for marker in WHERE_MARKERS):
            frames = [(j, x.strip()) for j, x in enumerate(lines[i + 1:], i + 1) if x.strip().startswith("File ")]
            if frames:
                j, frame = frames[-1]
                code = lines[j + 1].strip() if j + 1 < len(lines) else ""
                where = f"{frame[5:]}: {code}" if code and not code.startswith("File ") else frame[5:]
            break
    if not where:
        import traceback

        mine = [f for f in traceback.extract_tb(exc.__traceback__) if "/torch/" not in f.filename
                and "/cachesvc_client/" not in f.filename and "/one_call/" not in f.filename]
        if mine:
            where = f'"{mine[-1].filename}", line {mine[-1].lineno}, in {mine[-1].name}: {mine[-1].line or ""}'.rstrip(": ")
    return f"{type(exc).__name__}: {first}" + (f" (at {where[:300]})" if where else "")
