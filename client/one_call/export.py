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
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .calls import canonical

#: pytree node types the child knows without an import
BUILTIN_MODULES = ("builtins", "collections", "torch")


@dataclass
class Exported:
    """What ``export`` made: the modules the build child imports (``spec_modules``), how torch.export made the
    program (``"non-strict"``, else ``"strict"``), and the declared dims torch.export narrowed (name ->
    (min, max), with the fix it suggested), empty when it took the declaration as it was."""

    imports: List[str]
    how: str
    #: the plain tensor attributes the program reads as buffers of that name (``bind_attributes``)
    attributes: List[str] = field(default_factory=list)
    narrowed: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    fix: str = ""
    #: the program was lowered to ATen ops before it was saved (``_save``): its pre-dispatch form could not be
    decomposed: bool = False


def export(model: Any, example_inputs: Sequence[Any], path: str, *, kwargs: Optional[Mapping[str, Any]] = None,
           dynamic_shapes: Any = None, attributes: Sequence[str] = ()) -> Exported:
    """``torch.export`` a copy of ``model`` for ``model(*example_inputs, **kwargs)`` and save the program at
    ``path`` (.pt2).

    Non-strict export first (it runs the model's Python as it is); where it fails, strict export (Dynamo's
    trace, the proof's own tracer). A program ``torch.export.save`` cannot serialize is lowered to ATen first
    (``_save``). A declared range torch.export cannot serve whole ("Constraints violated
    ... Suggested fixes: seq = Dim('seq', max=128)") is narrowed by its own suggestion
    (``refine_dynamic_shapes_from_suggested_fixes``) within the declaration, and exported again; a fix that
    makes a dim derived from another is not taken. Raises the first attempt's error when nothing works.

    The keyword arguments are passed sorted by name (calls.canonical): the package's inputs are then in
    the order every call is flattened in, whatever order a caller writes them in. ``dynamic_shapes``:
    torch.export's (calls.CallSpec.export_dynamic_shapes). Called in the serving thread, between two
    calls (compiled.py): export sets torch.fx's module-level node metadata, which a compiled call running
    at the same time in another thread also sets, and torch 2.11's compiled ViT-B/16 died of that race
    (KeyError 'custom', then terminate) when export ran in the background thread. ``attributes``: the plain
    tensor attributes the package is to read live (the proof's: ``bind_attributes``)."""
    failures: List[BaseException] = []
    for strict in (False, True):
        shapes, narrowed, fix = dynamic_shapes, {}, ""
        for _ in range(2):  # as declared, then as torch.export suggests
            try:
                imports, decomposed, bound = _export(model, example_inputs, path, kwargs, shapes, strict, attributes)
                return Exported(imports, "strict" if strict else "non-strict", bound, narrowed, fix, decomposed)
            except Exception as exc:  # noqa: BLE001 - another way may work; nothing working raises the first
                failures.append(exc)
                refined = refine(exc, shapes)
                if refined is None:
                    break
                shapes, narrowed, fix = refined
    raise failures[0]


def refine(exc: BaseException, dynamic_shapes: Any) -> Optional[Tuple[Any, Dict[str, Tuple[int, int]], str]]:
    """torch.export's suggested fixes for ``exc``, applied to ``dynamic_shapes`` within what was declared:
    (the refined shapes, name -> (min, max) of each dim they narrowed, the fixes' text); None when ``exc``
    suggests none, or a fix ``CallSpec`` cannot serve (a dim derived from another)."""
    from torch.export import Dim
    from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes

    text = str(exc)
    if dynamic_shapes is None or "Suggested fixes:" not in text:
        return None
    fixes = [line.strip() for line in text[text.index("Suggested fixes:"):].splitlines()[1:]
             if line.startswith("  ") and " = " in line]
    if not fixes:
        return None
    try:
        refined = refine_dynamic_shapes_from_suggested_fixes("Suggested fixes:\n  " + "\n  ".join(fixes),
                                                              dynamic_shapes)
    except Exception:  # noqa: BLE001 - a fix torch cannot apply to this declaration
        return None
    declared = _dims(dynamic_shapes)
    narrowed: Dict[str, Tuple[int, int]] = {}

    def within(original: Any, new: Any) -> Any:
        name = getattr(original, "__name__", None)
        if name is None:
            return new
        if isinstance(new, int):
            narrowed[name] = (new, new)
            return new
        if hasattr(new, "fn") or not hasattr(new, "min"):  # derived (seq = 2 * _seq): not a range to serve
            raise ValueError(name)
        lo, hi = max(declared[name][0], new.min), min(declared[name][1], new.max)
        narrowed[name] = (lo, hi)
        return Dim(name, min=lo, max=hi)

    try:
        shapes = {arg: ({d: within(dims[d], new[d]) for d in new} if isinstance(new, Mapping) else new)
                  for arg, dims, new in _pairs(dynamic_shapes, refined)}
    except ValueError:
        return None
    return shapes, narrowed, "; ".join(fixes)


def _dims(dynamic_shapes: Any) -> Dict[str, Tuple[int, int]]:
    found = {}
    for dims in dynamic_shapes.values():
        for d in (dims or {}).values():
            if hasattr(d, "__name__") and hasattr(d, "min"):
                found[d.__name__] = (d.min, d.max)
    return found


def _pairs(declared: Any, refined: Any) -> List[Tuple[Any, Any, Any]]:
    return [(arg, declared.get(arg) or {}, refined.get(arg)) for arg in declared]


def _export(model: Any, example_inputs: Sequence[Any], path: str, kwargs: Optional[Mapping[str, Any]],
            dynamic_shapes: Any, strict: bool, attributes: Sequence[str]) -> Tuple[List[str], bool, List[str]]:
    """The modules the child imports, whether the saved program was lowered to ATen (``_save``), and the
    attributes it reads as buffers (``bind_attributes``)."""
    import torch

    twin = copy.deepcopy(model)  # export may patch the module it traces; the process keeps the original
    args, kw = canonical(example_inputs, kwargs)
    with torch.no_grad():
        program = torch.export.export(twin, args, kw, dynamic_shapes=dynamic_shapes, strict=strict)
    bound = bind_attributes(program, attributes)
    signature = program.module_call_graph[0].signature
    modules = spec_modules(signature.in_spec, signature.out_spec)
    return sorted(set(modules) | set(op_modules(program.graph))), _save(program, path), bound


def bind_attributes(program: Any, attributes: Sequence[str]) -> List[str]:
    """Make the program read each of ``attributes`` (plain tensor attributes of the model, by path) as a
    non-persistent buffer of that name; returns those it read (others it did not read, or lifted unnamed).

    torch.export lifts a plain tensor attribute (GPT-J's sinusoidal table on transformers 4.57) as a constant
    named by its path, but AOTInductor traces the program again and fx names each such tensor anew
    (``_tensor_constant0``): a weightless package then wants a value no live tensor is called by, and carrying
    the builder's would serve its value where the live process holds another. As a buffer it keeps its path,
    and the package reads the live tensor there, as it reads the model's weights (binding.py)."""
    from torch.export.graph_signature import InputKind

    wanted, bound = set(attributes), []
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.CONSTANT_TENSOR and spec.target in wanted:
            spec.kind, spec.persistent = InputKind.BUFFER, False
            bound.append(spec.target)
    return sorted(bound)


def _save(program: Any, path: str) -> bool:
    """Save ``program`` at ``path``; where its pre-dispatch form cannot be serialized, save it lowered to ATen ops
    (``run_decompositions({})``: no op decomposed, the same program AOTInductor lowers it to anyway) and say so.

    transformers 4.x decoders build their attention mask with ``torch.vmap``, which export records as the
    functorch calls that set it up: torch 2.11's serializer refuses the first of them (``Failed serializing node
    lazy_load_decompositions``), torch 2.13's the ``flat_apply`` node non-strict export leaves after them. Lowered,
    vmap's batching rules have run and none of those nodes is left. Raises the first error when even the
    lowered program cannot be saved (strict export is tried next)."""
    import torch

    try:
        torch.export.save(program, path)
        return False
    except Exception as exc:  # noqa: BLE001 - torch's serializer refuses a node: the ATen program may save
        first = exc
    try:
        # torch 2.13's run_decompositions deep-copies pytree specs, which warns of its own deprecated LeafSpec
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            torch.export.save(program.run_decompositions({}), path)
    except Exception:  # noqa: BLE001 - the error that names the node is the useful one
        raise first from None
    return True


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


#: operator namespaces torch registers itself: no import brings them
TORCH_NAMESPACES = ("aten", "prims", "higher_order", "_c10d_functional", "c10d_functional", "quantized", "profiler")


def op_modules(graph: Any) -> List[str]:
    """The modules that register the custom operators ``graph`` calls (``torch.library.custom_op``: transformers
    5's mixture-of-experts layers call ``torch.ops.transformers.grouped_mm_fallback``). A child that has not
    imported them cannot read the program back ("We failed to resolve torch.ops.transformers.grouped_mm_fallback
    .default to an operator"), nor run the package. An operator registered another way is left out: its build
    fails as it did, with torch's message."""
    from torch._library import custom_ops

    found = set()
    for node in graph.nodes:
        namespace = getattr(node.target, "namespace", None) if node.op == "call_function" else None
        if namespace is None or namespace in TORCH_NAMESPACES:
            continue
        definition = custom_ops.OPDEFS.get(node.target.name().split(".")[0])
        module = getattr(getattr(definition, "_init_fn", None), "__module__", None)
        if module and module != "__main__" and module.split(".")[0] not in BUILTIN_MODULES:  # a script's: no import
            found.add(module)
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
