"""The build's side of a proof: trace the model with Dynamo and record its guards, portably.

``capture`` runs in the process that compiled after a miss, in the thread and the grad/autocast state of
the model's first call (publisher.py). Nothing is compiled: Dynamo traces on fake tensors, its guards are
built and serialized by torch (``save=True``), and a guard filter that keeps every guard records, on the
way, each guard's value as portable.py describes it.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import time
import types
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import portable
from .container import Built, Entry, NoProof
from .guards import (CALL_LOCALS, CLASS_KINDS, GLOBAL_KINDS, INPUT, SLOT, STDLIB, attribute_fqn, first_line, key,
                     lines_digest, root)

#: a parameter's or buffer's base, where the model holds a view (DeBERTa-v2's ``position_ids`` buffer is
#: ``arange(...).expand(1, -1)``): Dynamo takes the base as a graph input of its own, but it is the model's
#: tensor, read through its slot, not a value outside the model
VIEW_OF_SLOT = re.compile(SLOT.pattern[:-1] + r"(\._base)+$")


def capture(model: Any, args: Sequence[Any], kwargs: Mapping[str, Any], *,
            dynamic: Sequence[Tuple[int, int]] = ()) -> Built:
    """Trace ``model(*args, **kwargs)`` with Dynamo (full graph, fake tensors, nothing compiled) in the
    caller's grad and autocast state, and serialize its guards. ``dynamic``: (leaf index, dim) pairs of
    the call's tensors (calls.leaves order) that vary; the guards then admit the sizes Dynamo proves
    the trace holds for. Raises NoProof (why, in one line) when the model cannot be traced in one graph
    or a guard cannot be carried to another process."""
    import torch

    started = time.monotonic()
    if _saved_tensor_hooks():
        raise NoProof("saved-tensor hooks are active: their identity cannot be carried to another process")
    args, kwargs = _dynamic_copies(tuple(args), dict(kwargs), dynamic)
    recorded: Dict[str, Optional[str]] = {}
    refused: List[str] = []
    attributes: List[str] = []
    classes: Dict[int, type] = {}
    try:
        # only the declared dims vary (marked by _dynamic_copies): a process that traced this model before at
        # other sizes (a build job building one shape after another) must not make the proof's sizes
        # symbolic by Dynamo's automatic dynamic shapes, which a process that has not traced it cannot check
        with torch.no_grad(), torch._dynamo.config.patch(automatic_dynamic_shapes=False):
            state, traced = _trace(model, args, kwargs, recorded, refused, classes, attributes)
    except NoProof:
        raise
    except Exception as exc:  # noqa: BLE001 - Dynamo raises many types for a model it cannot trace whole
        raise NoProof(f"Dynamo could not trace the model in one graph: {first_line(exc)}") from exc
    if refused:
        raise NoProof(f"a guard cannot be carried to another process: {refused[0]}")
    header = {"described": recorded, "sources": _sources(traced, classes.values()), "guards": len(recorded),
              "attributes": sorted(set(attributes))}
    entry = Entry(header=header, state=state, seconds=time.monotonic() - started, traced=frozenset(traced))
    return Built(torch=torch.__version__, entries=(entry,))


def _trace(model: Any, args: tuple, kwargs: dict, recorded: Dict[str, Optional[str]],
           refused: List[str], classes: Dict[int, type], attributes: List[str]) -> Tuple[bytes, list]:
    from torch._dynamo import convert_frame
    from torch._dynamo.hooks import Hooks
    from torch._dynamo.mutation_guard import install_generation_tagging_init
    from torch._dynamo.utils import dynamo_timed, get_metrics_context

    install_generation_tagging_init()  # as torch.compile does before tracing, and as Proof.load does

    def record(entries: Sequence[Any]) -> List[bool]:
        for entry in entries:
            _record(entry, recorded, refused)
            if entry.has_value and entry.guard_type in CLASS_KINDS:
                cls = entry.value if isinstance(entry.value, type) else type(entry.value)
                classes[id(cls)] = cls
        return [True] * len(entries)

    call = model.__call__  # hooks and a custom __call__ are part of what runs
    with get_metrics_context(), dynamo_timed("cachesvc_proof_capture"):
        captured = convert_frame.fullgraph_capture(call, args, kwargs)
        output = captured.graph_capture_output
        fn, _ = convert_frame.get_traced_fn(call)
        with _every_guard_serializable(), _only_the_call_pickled():
            check = output.build_guards(fn.__code__, hooks=Hooks(guard_filter_fn=record), save=True,
                                        strict_error=True)
    if check.guards_state is None:
        raise NoProof("torch did not serialize the guards")
    frame = convert_frame._get_frame(call, args, kwargs)
    _record_inputs(captured.backend_input.graph_module, output.output_graph, frame, recorded, refused, attributes)
    return check.guards_state, list(output.traced_code)


def _record_inputs(graph_module: Any, output_graph: Any, frame: Any, recorded: Dict[str, Optional[str]],
                   refused: List[str], attributes: List[str]) -> None:
    """The trace's graph inputs that are neither the call's nor a parameter or buffer: a numpy value, a
    tensor held in a global or in a plain attribute. Dynamo passes them to its graph at every call (its
    guards pin their layout, not their value), but torch.export bakes their value into the package: so their
    value is described too (``INPUT`` entries), and compared at load like any guard. A plain tensor attribute
    of the model or a submodule is the model's own instead: its path goes into ``attributes``, the package
    is bound to the live tensor there (export.bind_attributes, binding.py) and its slot is pinned (pins.py)."""
    import builtins

    from torch._dynamo.guards import _get_closure_vars

    sources = list(getattr(output_graph, "input_source_to_sizes_strides", {}) or {})
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    tensors = [n for n in placeholders if _is_tensor(n.meta.get("example_value"))]
    if len(tensors) > len(sources):  # every tensor Dynamo wrapped has its source here, used by the graph or not
        refused.append(f"the trace has {len(tensors)} tensor inputs but names only {len(sources)} tensors")
        return
    for node in placeholders:
        if node not in tensors and not _is_symbolic(node.meta.get("example_value")):
            refused.append(f"the trace takes {node.name} ({type(node.meta.get('example_value')).__name__}) as an "
                           "input whose value would be baked into the package")
    scope = {"L": frame.locals, "G": frame.globals, "__builtins__": builtins.__dict__}
    for source in sources:
        if root(source) in CALL_LOCALS or (root(source) == "self" and (SLOT.search(source.name) or
                                                                    VIEW_OF_SLOT.search(source.name))):
            continue
        try:
            value = source.get_value(scope, _get_closure_vars(), {})
            fqn = attribute_fqn(source.name)
            if fqn is not None and type(value) is _tensor_type():  # the model's own, bound live by its path
                attributes.append(fqn)
                continue
            described = portable.graph_input(value)
        except Exception as exc:  # noqa: BLE001
            described = None
            refused.append(f"the trace's input {source.name} cannot be read ({first_line(exc)})")
        if described is None:
            refused.append(f"the trace's input {source.name} is not a value a package can be checked against")
        recorded[INPUT + source.name] = described


def _tensor_type() -> type:
    import torch

    return torch.Tensor


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _is_symbolic(value: Any) -> bool:
    """A dynamic size: Dynamo passes it from the call's own tensors."""
    import torch

    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _record(entry: Any, recorded: Dict[str, Optional[str]], refused: List[str]) -> None:
    guard = entry.orig_guard
    kind = entry.guard_type
    if kind in GLOBAL_KINDS:
        return
    if kind not in portable.DESCRIBE:
        refused.append(f"{kind} on {guard.name}")
        return
    if root(guard.originating_source) in CALL_LOCALS:
        return
    filed = key(guard)
    if not entry.has_value:
        recorded[filed] = None
        return
    try:
        described = portable.describe(kind, entry.value)
    except Exception as exc:  # noqa: BLE001 - an object that cannot be described is a refusal, not a crash
        described, why = None, first_line(exc)
    else:
        why = "not a plain value"
    if described is None:
        refused.append(f"{kind} on {guard.name} ({why})")
    recorded[filed] = described


@contextlib.contextmanager
def _every_guard_serializable():
    """torch refuses to serialize identity guards (ID_MATCH and kin) because an id means nothing in another
    process; here each is described portably (``_record``) and compared at load before the guard tree is
    rebuilt over the live objects, so torch may keep them in its state."""
    from torch._dynamo.guards import CheckFunctionManager

    saved = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES = ("DICT_VERSION", "WEAKREF_ALIVE")
    try:
        yield
    finally:
        CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES = saved


@contextlib.contextmanager
def _only_the_call_pickled():
    """torch pickles the traced frame's locals and globals, so that a restarted process can rebuild each
    guard's expectation from them. Here the model's and the globals' guards are compared portably and
    rebuilt over the live objects (``_rebuild``): only the call's values (``args``, ``kwargs``) and the
    names of the modules Dynamo imported need to travel. The model itself (the classes a transformers
    model defines inside functions cannot be pickled at all) and the module globals stay behind."""
    from torch._dynamo import guards as guards_mod

    pickle_state, local_type_error = guards_mod.pickle_guards_state, guards_mod.raise_local_type_error

    def pruned(state: Any, builder: Any) -> bytes:
        graph = state.output_graph
        graph.local_scope = {k: v for k, v in graph.local_scope.items() if k in CALL_LOCALS}
        graph.global_scope = {k: v for k, v in graph.global_scope.items() if isinstance(v, types.ModuleType)}
        return pickle_state(state, builder)

    def pickled_later(obj: Any) -> None:
        """torch refuses a TYPE_MATCH on a class defined inside a function before pickling anything,
        since it cannot pickle that class; only the call's values are pickled here, and the pickler
        still refuses such a class among them."""

    guards_mod.pickle_guards_state, guards_mod.raise_local_type_error = pruned, pickled_later
    try:
        with _sources_by_their_init_fields():
            yield
    finally:
        guards_mod.pickle_guards_state, guards_mod.raise_local_type_error = pickle_state, local_type_error


@contextlib.contextmanager
def _sources_by_their_init_fields():
    """Pickle Dynamo's sources as torch 2.13 does: made again from their ``__init__`` fields only. torch
    2.11's reduce also passes the fields its ``__post_init__`` computes (``DefaultsSource``), which its own
    unpickling then refuses (``__init__() takes from 3 to 4 positional arguments but 6 were given``): a
    transformers 4.x model's guards read a function's defaults."""
    import copyreg
    import dataclasses

    from torch._guards import Source

    classes, todo = [], [Source]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if dataclasses.is_dataclass(cls) and any(not f.init for f in dataclasses.fields(cls)):
            classes.append(cls)
    saved = {cls: copyreg.dispatch_table.get(cls) for cls in classes}
    for cls in classes:
        copyreg.pickle(cls, _reduce_source)
    try:
        yield
    finally:
        for cls, reducer in saved.items():
            if reducer is None:
                copyreg.dispatch_table.pop(cls, None)
            else:
                copyreg.dispatch_table[cls] = reducer


def _reduce_source(source: Any) -> Tuple[Any, tuple]:
    import dataclasses

    return type(source), tuple(getattr(source, f.name) for f in dataclasses.fields(source) if f.init)


def _dynamic_copies(args: tuple, kwargs: dict, dynamic: Sequence[Tuple[int, int]]) -> Tuple[tuple, dict]:
    """The call with the tensors that have varying dims replaced by copies marked for Dynamo (the marks
    are attributes on the tensor: the caller's own tensors stay as they were)."""
    if not dynamic:
        return args, kwargs
    import torch
    from torch.utils import _pytree as pytree

    from ..calls import canonical

    flat, spec = pytree.tree_flatten(canonical(args, kwargs))
    for index, dim in dynamic:
        t = flat[index]
        if not getattr(t, "_cachesvc_copy", False):
            copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            copy.copy_(t)
            copy._cachesvc_copy = True
            flat[index] = t = copy
        torch._dynamo.maybe_mark_dynamic(t, dim)
    args, kwargs = pytree.tree_unflatten(flat, spec)
    return tuple(args), dict(kwargs)


def _saved_tensor_hooks() -> bool:
    import torch

    get = getattr(getattr(getattr(torch._functorch, "_aot_autograd", None), "utils", None),
                  "top_saved_tensors_hooks", None)
    return bool(get is not None and get() is not None)


def _sources(traced: list, classes: Any) -> List[List[Any]]:
    """[module, first line, last line, digest] of every code object Dynamo traced: the lines that ran.
    Code made at run time has no lines (a dataclass's ``__init__``): it is covered when it is a member of
    a class the proof describes (``classes``: portable.klass holds its members' code), else refused."""
    import inspect

    generated = _member_code(classes)
    found = []
    for code in traced:
        if code.co_filename.startswith("<") and not code.co_filename.startswith("<frozen ") \
                and portable.code(code) in generated:
            continue
        module = inspect.getmodule(code)
        if (module.__name__.split(".")[0] in STDLIB) if module is not None else code.co_filename.startswith("<frozen "):
            continue  # Python's own library, some of it frozen without source: the key's Python version
        try:
            lines, first = inspect.getsourcelines(code)
        except (OSError, TypeError) as exc:
            raise NoProof(f"Dynamo traced {code.co_qualname if hasattr(code, 'co_qualname') else code.co_name} "
                          f"without a source file ({exc}): an edit to it could not be seen") from exc
        if module is None:
            raise NoProof(f"Dynamo traced {code.co_filename} outside any module: an edit to it could not be seen")
        found.append([module.__name__, first, first + len(lines), lines_digest(lines)])
    return sorted({tuple(f) for f in found})  # type: ignore[return-value]


def _member_code(classes: Any) -> set:
    import types

    found = set()
    for cls in classes:
        for c in getattr(cls, "__mro__", ()):
            for attr in vars(c).values():
                fn = getattr(attr, "__func__", attr)
                if isinstance(fn, types.FunctionType):
                    found.update(portable.code(f.__code__) for f in portable.unwrapped(fn))
    return found


@contextlib.contextmanager
def environment_reads(built: Built):
    """Record the names of the environment variables the model's own code reads (``os.environ[...]``,
    ``.get``, ``os.getenv``; present or not) in this thread, while it runs its Python for real (torch.export):
    reads from the code Dynamo traced (``built.traced``), not torch's own settings. Dynamo guards a
    variable's value only when it is set: one that was unset at build and is set at a restart passes its
    guards (torch.compile itself then serves the old graph), so the proof pins them (``with_environment``)."""
    import threading

    environ_type = type(os.environ)
    getitem = environ_type.__getitem__
    me = threading.get_ident()
    names: List[str] = []
    library = {os.__file__, getattr(sys.modules.get("_collections_abc"), "__file__", None), "<frozen os>",
               "<frozen _collections_abc>"}

    def recording(self: Any, key: Any) -> Any:
        if self is os.environ and isinstance(key, str) and threading.get_ident() == me:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename in library:
                frame = frame.f_back
            if frame is not None and frame.f_code in built.traced:
                names.append(key)
        return getitem(self, key)

    environ_type.__getitem__ = recording
    try:
        yield names
    finally:
        environ_type.__getitem__ = getitem
