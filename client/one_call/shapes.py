"""Calls of other shapes made from the example call: what a warm-up runs and a build job builds for.

A shape is the text ``shape_signature`` gives a call (``f32[8,256]``, ``attention_mask=i64[2,64],...``):
what the fleet reports (cachesvc_client.usage). ``resized`` turns the example call into a call of that
shape: the same structure and dtypes, each tensor's values taken in order from the example's own
(repeated as needed), so token ids stay token ids and a mask stays a mask. A text that is not a shape of
this call (another count of inputs, another dtype or rank, a non-tensor in another place) gives None.
"""
from __future__ import annotations

import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..process.fingerprint import shape_signature, sorted_keys

#: one item of a shape text: an optional ``key=`` path, then a tensor ``dtype[d0,d1]`` or a type name
_ITEM = re.compile(r"((?:[^,=\[\]]+=)*)(?:([A-Za-z0-9_.]+)\[([0-9,]*)\]|([A-Za-z_][A-Za-z0-9_.]*))(?:,|$)")


def items(text: str) -> Optional[List[Tuple[str, Optional[str], Optional[Tuple[int, ...]]]]]:
    """``(prefix, dtype, dims)`` per item of a shape text (``dtype`` and ``dims`` None for a non-tensor,
    whose type name is then in ``prefix``'s place); None when the text is not one."""
    out, at = [], 0
    while at < len(text):
        m = _ITEM.match(text, at)
        if m is None or m.end() == at:
            return None
        prefix, dtype, dims, other = m.groups()
        if dtype is not None:
            out.append((prefix, dtype, tuple(int(d) for d in dims.split(",")) if dims else ()))
        else:
            out.append((prefix + other, None, None))
        at = m.end()
    return out


def signature(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> str:
    """A call's shape text, as the key's is made from the example call."""
    return shape_signature(*args, kwargs) if kwargs else shape_signature(*args)


def resized(args: Tuple[Any, ...], kwargs: Dict[str, Any], text: str) -> Optional[Tuple[tuple, dict]]:
    """The example call ``(args, kwargs)`` made into a call of shape ``text``, or None (see the module)."""
    wanted = items(text)
    if wanted is None:
        return None
    targets = iter(dims for _, dtype, dims in wanted if dtype is not None)
    try:
        new_args = tuple(_rebuild(a, targets) for a in args)
        new_kwargs = _rebuild(kwargs, targets)
    except _NotThisCall:
        return None
    if next(targets, None) is not None:
        return None
    return (new_args, new_kwargs) if signature(new_args, new_kwargs) == text else None


class _NotThisCall(Exception):
    pass


def _rebuild(x: Any, targets: Iterator[Tuple[int, ...]]) -> Any:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        dims = next(targets, None)
        if dims is None or len(dims) != len(x.shape):
            raise _NotThisCall
        return _tiled(x, dims)
    if isinstance(x, dict):  # in shape_signature's order, returned in the dict's own
        done = {k: _rebuild(x[k], targets) for k in sorted_keys(x)}
        return {k: done[k] for k in x}
    if isinstance(x, (list, tuple)):
        return type(x)(_rebuild(item, targets) for item in x)
    return x


def _tiled(t: Any, dims: Tuple[int, ...]) -> Any:
    """A tensor of ``dims`` whose values are ``t``'s, in order, repeated (zeros where ``t`` has none)."""
    import torch

    n = 1
    for d in dims:
        n *= d
    with torch.no_grad():
        flat = t.detach().reshape(-1)
        if flat.numel() == 0:
            return torch.zeros(dims, dtype=t.dtype, device=t.device)
        return flat[torch.arange(n, device=t.device) % flat.numel()].reshape(dims).contiguous()
