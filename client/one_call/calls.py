"""The calls a package serves: the example call's arguments (positional and keyword), and the shapes declared.

A call is flattened the way torch.export flattens it, ``(args, kwargs)`` with the keyword arguments in
sorted order (the package is exported with them sorted, so a caller that passes them in another order
still gives each tensor its place). The package serves a call when its structure (argument count,
keyword names) is the example's and every tensor matches: dtype, device, requires_grad, and its shape:

- nothing declared: the example's shape and strides, exactly;
- ``dynamic_shapes`` (torch.export's form: ``{"input_ids": {0: Dim("batch", min=1, max=16)}}``, or a
  tuple in the order of the arguments): each declared dim within its range, dims of one name equal,
  every other dim the example's; the tensor contiguous when the example was;
- ``examples`` (a list of further example calls: argument tuples, or keyword dicts when the model is
  called with keywords): exactly one of the declared shapes. The dims that differ between them become
  the package's dynamic dims (dims that always vary together share one), so one package serves all.

torch is imported by the caller; these functions only use the objects given.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

#: a dim: an int (static) or (name, min, max) (dynamic)
Dim_ = Any
#: the largest size a Dim without ``max`` stands for (torch's int_oo)
UNBOUNDED = 2 ** 62


def canonical(args: Sequence[Any], kwargs: Optional[Mapping[str, Any]]) -> Tuple[tuple, Dict[str, Any]]:
    """(args, kwargs sorted by name): the order the package's inputs are flattened in."""
    return tuple(args), {k: kwargs[k] for k in sorted(kwargs or {})}


def leaves(args: Sequence[Any], kwargs: Optional[Mapping[str, Any]]) -> Tuple[List[Any], Any]:
    """The call's leaves in the package's order, and its pytree structure."""
    from torch.utils import _pytree as pytree

    return pytree.tree_flatten(canonical(args, kwargs))


@dataclass(frozen=True)
class TensorSpec:
    shape: Tuple[Dim_, ...]
    stride: Tuple[int, ...]
    dtype: Any
    device: Any
    requires_grad: bool
    contiguous: bool

    @classmethod
    def of(cls, t: Any, dims: Optional[Tuple[Dim_, ...]] = None) -> "TensorSpec":
        return cls(tuple(dims or t.shape), tuple(t.stride()), t.dtype, t.device, bool(t.requires_grad),
                   bool(t.is_contiguous()))

    @property
    def dynamic(self) -> bool:
        return any(not isinstance(d, int) for d in self.shape)

    def mismatch(self, t: Any, sizes: Dict[str, int]) -> Optional[str]:
        """None when ``t`` fits; ``sizes`` collects the dynamic dims' values (a name seen twice must agree)."""
        if t.dtype != self.dtype:
            return f"dtype {t.dtype}, built for {self.dtype}"
        if t.device != self.device:
            return f"device {t.device}, built for {self.device}"
        if bool(t.requires_grad) != self.requires_grad:
            return f"requires_grad={t.requires_grad}, built for {self.requires_grad}"
        why = self._shape_mismatch(tuple(t.shape), sizes)
        if why:
            return why
        if not self.dynamic and tuple(t.stride()) != self.stride:
            return f"strides {tuple(t.stride())}, built for {self.stride}"
        if self.dynamic and self.contiguous and not t.is_contiguous():
            return "not contiguous, built for contiguous inputs"
        return None

    def _shape_mismatch(self, shape: Tuple[int, ...], sizes: Dict[str, int]) -> Optional[str]:
        if len(shape) != len(self.shape):
            return f"shape {shape}, built for {self.text()}"
        for i, (got, want) in enumerate(zip(shape, self.shape)):
            if isinstance(want, int):
                if got != want:
                    return f"shape {shape}, built for {self.text()}"
                continue
            name, lo, hi = want
            if not lo <= got <= hi:
                return f"dim {i} is {got}, outside the declared {name} in [{lo}, {hi}]"
            if sizes.setdefault(name, got) != got:
                return f"dim {i} is {got}, but {name} is {sizes[name]} in another input"
        return None

    def text(self) -> str:
        """``(2, batch:1..16)``: the shape as declared."""
        dims = [str(d) if isinstance(d, int) else f"{d[0]}:{d[1]}..{d[2]}" for d in self.shape]
        return "(" + ", ".join(dims) + ")"


class CallSpec:
    """What a package serves: the example call's structure, its tensors, the declared shapes, the training flag."""

    def __init__(self, args: Sequence[Any], kwargs: Optional[Mapping[str, Any]], training: bool, *,
                 dynamic_shapes: Any = None, examples: Optional[Sequence[Any]] = None, forward: Any = None,
                 leaf_dims: Optional[List[Optional[Tuple[Dim_, ...]]]] = None):
        """``leaf_dims``: each leaf's dims as a key's text declared them (``parse_declared``), in place of
        ``dynamic_shapes``: how a restarted process serves a package another process built."""
        flat, self.structure = leaves(args, kwargs)
        self.training = training
        self.keywords = tuple(sorted(kwargs or {}))
        self.examples: Optional[List[Tuple[Tuple[int, ...], ...]]] = None
        if dynamic_shapes is not None and examples:
            raise ValueError("declare the shapes once: dynamic_shapes or examples, not both")
        dims: List[Optional[Tuple[Dim_, ...]]] = [None] * len(flat)
        #: the calls the publish check compares with eager: the example, and every declared example
        self.calls = [(tuple(args), dict(kwargs or {}))] + [_as_call(e) for e in examples or ()]
        if examples:
            flats = [leaves(a, k)[0] for a, k in self.calls]
            dims = dims_from_examples(flats)
            self.examples = sorted({tuple(tuple(t.shape) for t in call) for call in flats})
        elif dynamic_shapes is not None:
            dims = dims_declared(dynamic_shapes, args, kwargs, forward, flat)
        elif leaf_dims is not None:
            if len(leaf_dims) != len(flat):
                raise ValueError(f"{len(leaf_dims)} declared inputs for {len(flat)}")
            dims = list(leaf_dims)
        self.tensors = tuple(TensorSpec.of(t, d) for t, d in zip(flat, dims))
        #: the example's tensors were its arguments themselves (no nesting): then a call whose arguments
        #: are tensors too is flattened without pytree (``_leaves``), a third of a served call's overhead
        self._plain = len(flat) == len(args) + len(self.keywords) and type(flat[0]) if flat else None
        self._positional = len(args)

    @property
    def dynamic(self) -> bool:
        return any(t.dynamic for t in self.tensors)

    def narrow(self, served: Mapping[str, Tuple[int, int]]) -> None:
        """Serve each named dim only within ``served``'s (min, max): what the package was exported for where
        torch.export narrowed a declaration (export.refine). The key keeps the declaration."""
        def dim(d: Dim_) -> Dim_:
            if isinstance(d, int) or d[0] not in served:
                return d
            lo, hi = served[d[0]]
            return d[0], max(d[1], lo), min(d[2], hi)

        self.tensors = tuple(TensorSpec(tuple(dim(d) for d in t.shape), t.stride, t.dtype, t.device,
                                        t.requires_grad, t.contiguous) for t in self.tensors)

    def served_text(self) -> str:
        """``seq=2..128,batch=1..8``: each named dim's range as served (the package's meta ``dims``)."""
        ranges = {d[0]: (d[1], d[2]) for t in self.tensors for d in t.shape if not isinstance(d, int)}
        return ",".join(f"{name}={lo}..{hi}" for name, (lo, hi) in sorted(ranges.items()))

    def dynamic_leaves(self) -> List[Tuple[int, int]]:
        """(leaf index, dim) of every declared varying dim: what the proof's trace marks dynamic."""
        return [(i, d) for i, t in enumerate(self.tensors) for d, dim in enumerate(t.shape) if not isinstance(dim, int)]

    def flat(self, args: Sequence[Any], kwargs: Optional[Mapping[str, Any]]) -> List[Any]:
        return self._leaves(args, kwargs, tuple(sorted(kwargs or {})))[0]

    def mismatch(self, args: Sequence[Any], kwargs: Optional[Mapping[str, Any]], model: Any) -> Optional[str]:
        """None when the package serves this call; else the reason, for the fallback's log line."""
        return self.match(args, kwargs, model)[0]

    def match(self, args: Sequence[Any], kwargs: Optional[Mapping[str, Any]],
              model: Any) -> Tuple[Optional[str], Optional[List[Any]]]:
        """``(mismatch, the call's tensors in the package's order)``: the tensors only when it serves."""
        got = tuple(sorted(kwargs or {}))
        if got != self.keywords:
            return f"keyword arguments {list(got)}, built for {list(self.keywords)}", None
        flat, structure = self._leaves(args, kwargs, got)
        if len(flat) != len(self.tensors):
            return f"{len(flat)} inputs, built for {len(self.tensors)}", None
        if structure is not None and structure != self.structure:
            return "the arguments' structure (nesting, positions) is not the example's", None
        if bool(model.training) != self.training:
            return f"model.training={model.training}, built with {self.training}", None
        sizes: Dict[str, int] = {}
        for i, (arg, spec) in enumerate(zip(flat, self.tensors)):
            why = spec.mismatch(arg, sizes) if hasattr(arg, "stride") and hasattr(arg, "dtype") else "not a tensor"
            if why:
                return f"input {i}: {why}", None
        if self.examples is not None and tuple(tuple(t.shape) for t in flat) not in self.examples:
            return f"shapes {[tuple(t.shape) for t in flat]} are not among the {len(self.examples)} declared", None
        return None, flat

    def _leaves(self, args: Sequence[Any], kwargs: Optional[Mapping[str, Any]],
                keywords: Tuple[str, ...]) -> Tuple[List[Any], Any]:
        """``leaves``, with the structure None where it is the example's by construction: the example's
        arguments were all tensors, and so are this call's, as many, under the same keywords (pytree's
        flatten costs 8 us a call on the bench CPU; this, under one)."""
        plain = self._plain
        if plain and len(args) == self._positional and keywords == self.keywords:
            flat = [*args, *(kwargs[k] for k in keywords)] if keywords else list(args)
            if all(type(x) is plain for x in flat):
                return flat, None
        return leaves(args, kwargs)

    def export_dynamic_shapes(self, forward: Any, args: Sequence[Any], kwargs: Optional[Mapping[str, Any]]) -> Any:
        """torch.export's ``dynamic_shapes`` for the canonical call (None when nothing varies)."""
        if not self.dynamic:
            return None
        from torch.export import Dim

        made: Dict[str, Any] = {}

        def dim(d: Dim_) -> Any:
            name, lo, hi = d
            return made.setdefault(name, Dim(name, min=lo, max=hi))

        per_leaf = [{i: dim(d) for i, d in enumerate(t.shape) if not isinstance(d, int)} or None
                    for t in self.tensors]
        # keyed by argument name, as torch.export binds them (its tuple form follows the forward's order)
        positional = list(inspect.signature(forward).bind_partial(*args).arguments)[:len(args)]
        return dict(zip([*positional, *self.keywords], per_leaf))

    def signature(self, base: str) -> str:
        """The key's shape text: ``base`` (shape_signature of the example) and what was declared."""
        if self.examples is not None:
            return base + "|examples=" + ";".join(",".join("x".join(map(str, s)) for s in call)
                                                  for call in self.examples)
        if self.dynamic:
            return base + "|dynamic=" + ",".join(t.text().replace(" ", "") for t in self.tensors)
        return base


def parse_declared(text: str) -> Optional[List[Tuple[Dim_, ...]]]:
    """The dims of each input as ``CallSpec.signature`` wrote them after ``|dynamic=`` (``(2,batch:1..16),(8)``);
    None for a text that is not one (it comes from the service: untrusted)."""
    groups = re.findall(r"\(([^()]*)\)", text)
    if not groups or "".join(f"({g})" for g in groups).replace(",(", "(") != text.replace(",(", "("):
        return None
    out: List[Tuple[Dim_, ...]] = []
    for group in groups:
        dims: List[Dim_] = []
        for part in filter(None, group.split(",")):
            name, colon, span = part.partition(":")
            lo, dots, hi = span.partition("..")
            if not colon and part.isdigit():
                dims.append(int(part))
            elif colon and dots and name.isidentifier() and lo.isdigit() and hi.isdigit() and int(lo) <= int(hi):
                dims.append((name, int(lo), int(hi)))
            else:
                return None
        out.append(tuple(dims))
    return out


def parse_served(text: str) -> Dict[str, Tuple[int, int]]:
    """``served_text``'s ranges; nothing for a text that is not one (a package's meta is untrusted)."""
    served: Dict[str, Tuple[int, int]] = {}
    for part in (text or "").split(","):
        name, _, span = part.partition("=")
        lo, _, hi = span.partition("..")
        if name and lo.isdigit() and hi.isdigit():
            served[name] = (int(lo), int(hi))
    return served


def _as_call(example: Any) -> Tuple[tuple, Dict[str, Any]]:
    """A declared example as (args, kwargs): a dict is keyword arguments, a tuple or list positional ones."""
    if isinstance(example, Mapping):
        return (), dict(example)
    if isinstance(example, (tuple, list)):
        return tuple(example), {}
    raise ValueError(f"each declared example is a tuple of positional arguments or a dict of keyword "
                     f"arguments, not a {type(example).__name__}")


def dims_from_examples(calls: List[List[Any]]) -> List[Optional[Tuple[Dim_, ...]]]:
    """Per leaf, its dims: static where every example agrees, else a named range over the examples'
    values; dims whose values agree in every example share a name (torch.export then relates them)."""
    shapes = [[tuple(getattr(t, "shape", ())) for t in call] for call in calls]
    first = shapes[0]
    for call in shapes[1:]:
        if len(call) != len(first) or any(len(a) != len(b) for a, b in zip(call, first)):
            raise ValueError("every declared example must have the example's arguments, each with as many dims")
    names: Dict[Tuple[int, ...], str] = {}
    out: List[Optional[Tuple[Dim_, ...]]] = []
    for leaf, shape in enumerate(first):
        dims: List[Dim_] = []
        for d in range(len(shape)):
            values = tuple(call[leaf][d] for call in shapes)
            if len(set(values)) == 1:
                dims.append(values[0])
                continue
            name = names.setdefault(values, f"d{len(names)}")
            dims.append((name, min(values), max(values)))
        out.append(tuple(dims))
    return out


def dims_declared(dynamic_shapes: Any, args: Sequence[Any], kwargs: Optional[Mapping[str, Any]], forward: Any,
                  flat: List[Any]) -> List[Optional[Tuple[Dim_, ...]]]:
    """Per leaf, its dims from torch.export's ``dynamic_shapes``: a dict keyed by the forward's argument
    names, or a tuple/list in the order of the arguments (positional, then keyword). Only top-level
    tensor arguments can be declared, each with a ``Dim(name, min=, max=)`` per varying dim."""
    from torch.export.dynamic_shapes import _DimHint

    if isinstance(dynamic_shapes, Mapping):
        positional = inspect.signature(forward).bind_partial(*args).arguments if forward is not None else {}
        bound = {**positional, **dict(kwargs or {})}
        unknown = sorted(set(dynamic_shapes) - set(bound))
        if unknown:
            raise ValueError(f"dynamic_shapes names {unknown}, which the call does not pass")
        by_name = dict(dynamic_shapes)
    else:
        bound = dict(zip([f"#{i}" for i in range(len(args))] + list(kwargs or {}), [*args, *(kwargs or {}).values()]))
        if len(dynamic_shapes) != len(bound):
            raise ValueError(f"dynamic_shapes has {len(dynamic_shapes)} entries for {len(bound)} arguments")
        by_name = dict(zip(bound, dynamic_shapes))
    names = list(by_name)
    declared = {}
    for name in names:
        spec = by_name.get(name)
        if spec is None:
            continue
        value = bound[name]
        if not hasattr(value, "shape"):
            raise ValueError(f"dynamic_shapes for {name!r}: only tensor arguments can have dynamic dims")
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec)
        dims: List[Dim_] = list(value.shape)
        for i, d in items:
            if d is None or (isinstance(d, _DimHint) and "STATIC" in str(d)):
                continue
            lo, hi = getattr(d, "min", None), getattr(d, "max", None)
            if isinstance(d, _DimHint) or lo is None or hi is None or hasattr(d, "fn"):
                raise ValueError(f"dynamic_shapes for {name!r} dim {i}: declare torch.export.Dim(name, min=..., "
                                 f"max=...) (hints and derived dims are not served from a package)")
            dims[i] = (d.__name__, int(lo), int(hi) if hi < UNBOUNDED else UNBOUNDED)
        declared[id(value)] = tuple(dims)
    return [declared.get(id(t)) for t in flat]
