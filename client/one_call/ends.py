"""The ends of a declared range: the calls the publish check adds, and the proof entry that covers each.

A package built for ``Dim("batch", min=1, max=16)`` must be right at 1 and at 16, not only at the example's
batch. So the publish check (verify.py) also runs each declared dim at its ends (every input that shares
the dim at once), against eager, and the proof (proof/) must admit each end it serves:

- ``plan``, in the thread of the model's first call: the example's trace admits most ends. Dynamo
  specializes sizes 0 and 1 (a ``squeeze()`` is another computation at 1), so its guards refuse an end at 1:
  that end gets a trace of its own, taken at the end's inputs (its other dims still dynamic), as a second
  entry of the proof. An end no trace admits is never served: the range is narrowed, in one log line;
- ``settle``, after the check: an end whose own entry's package output differs from eager loses that entry
  (narrowed, one log line: calls of that size run torch.compile); an end the example's trace admits must
  pass, or the package is not published (its guards would serve that size).

Ends too large to run here (an unbounded ``max``) are not checked: the log says which.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from . import proof
from .calls import UNBOUNDED, canonical
from ..errors import LoadFailed

log = logging.getLogger("cachesvc_client")

#: an end that would make a call this many times the example's size along its dim is not run
MAX_GROWTH = 64

Call = Tuple[tuple, Dict[str, Any]]


@dataclass(frozen=True)
class End:
    name: str
    size: int
    call: Call
    entry: int  # the proof entry that admits it: 0 is the example's trace


def plan(compiled: Any, built: "proof.Built") -> Tuple["proof.Built", List[End]]:
    """The declared ranges' ends and the proof entry admitting each, traces added for the ends the example's
    refuses. In the serving thread, in its grad/autocast state (as ``proof.capture``)."""
    import torch

    found = _end_calls(compiled.spec, compiled.args, compiled.call_kwargs)
    if not found:
        return built, []
    with torch.no_grad():
        checked = proof.Proof.load(built.data, compiled.model)
        ends = []
        for name, size, call in found:
            if checked.holds(*call):
                ends.append(End(name, size, call, 0))
                continue
            why = checked.why_not(*call)
            try:
                own = proof.capture(compiled.model, *call, dynamic=compiled.spec.dynamic_leaves())
            except proof.NoProof as exc:
                _narrowed(compiled, name, size, f"the example's trace does not admit it ({why}) and its own "
                                                f"trace failed: {exc.message}")
                continue
            built = built.add(own)
            ends.append(End(name, size, call, len(built.entries) - 1))
    return built, ends


def settle(compiled: Any, built: "proof.Built", ends: List[End], failed: Dict[int, str]) -> "proof.Built":
    """The proof after the publish check (``failed``: end index -> why its output differs from eager). Raises
    LoadFailed when an end the example's trace admits differs: that package must not be published."""
    dropped = []
    for index, why in sorted(failed.items()):
        end = ends[index]
        if end.entry == 0:
            raise LoadFailed(f"the package does not reproduce eager at declared {end.name}={end.size}, which its "
                             f"guards admit: {why}")
        dropped.append(end.entry)
        _narrowed(compiled, end.name, end.size, f"the package does not reproduce eager there: {why}")
    return built.without(dropped)


def _narrowed(compiled: Any, name: str, size: int, why: str) -> None:
    log.warning("cachesvc compile %s: declared %s=%d is not served by the package (%s); the rest of the range "
                "is, and calls of that size run torch.compile", compiled.name, name, size, why)


def _end_calls(spec: Any, args: Any, kwargs: Dict[str, Any]) -> List[Tuple[str, int, Call]]:
    """(dim name, size, call) for each end of each declared range other than the example's own size."""
    from torch.utils import _pytree as pytree

    flat, tree = pytree.tree_flatten(canonical(args, kwargs))
    found = []
    for name, (lo, hi) in _named_dims(spec).items():
        example = _size_of(spec, flat, name)
        for size in sorted({lo, hi}):
            if size == example:
                continue
            if size >= UNBOUNDED or size > MAX_GROWTH * max(1, example):
                log.info("cachesvc compile: declared %s=%d is not checked against eager (too large to run here)",
                         name, size)
                continue
            resized = [_resized(t, s, name, size) for t, s in zip(flat, spec.tensors)]
            call_args, call_kwargs = pytree.tree_unflatten(resized, tree)
            found.append((name, size, (tuple(call_args), dict(call_kwargs))))
    return found


def _named_dims(spec: Any) -> Dict[str, Tuple[int, int]]:
    """Each declared dim's (min, max), by name."""
    dims: Dict[str, Tuple[int, int]] = {}
    for tensor in spec.tensors:
        for d in tensor.shape:
            if not isinstance(d, int):
                dims[d[0]] = (d[1], d[2])
    return dims


def _size_of(spec: Any, flat: List[Any], name: str) -> int:
    for t, tensor in zip(flat, spec.tensors):
        for i, d in enumerate(tensor.shape):
            if not isinstance(d, int) and d[0] == name:
                return int(t.shape[i])
    raise KeyError(name)


def _resized(t: Any, tensor: Any, name: str, size: int) -> Any:
    """``t`` with every dim declared as ``name`` made ``size`` long: cut, or tiled from its own values (token
    ids stay token ids), contiguous."""
    out = t
    for i, d in enumerate(tensor.shape):
        if isinstance(d, int) or d[0] != name:
            continue
        have = out.shape[i]
        if size > have:
            reps = [1] * out.dim()
            reps[i] = math.ceil(size / max(1, have))
            out = out.repeat(*reps)
        out = out.narrow(i, 0, size)
    return out.contiguous().clone() if out is not t else out
