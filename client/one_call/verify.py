"""Verify: the publish check. A built package is run the way a fresh hit runs it, in a child
process, on weights it was not built with, and compared with eager; only a package that passes is
published."""
from __future__ import annotations

import copy
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from .build import last_line
from .calls import leaves
from .binding import attribute_slots
from .runner import live_constants
from ..errors import LoadFailed


def perturb(model: Any, attributes: Sequence[str] = ()) -> None:
    """Scale every floating parameter and buffer of ``model`` in place by seeded factors in [0.5, 1.5]
    (signs kept: a BatchNorm's running variance stays positive), and the plain tensor attributes at the
    paths ``attributes``."""
    import torch

    gen = torch.Generator().manual_seed(18)
    bound = [t for _, _, t in attribute_slots(model, attributes).values()]
    with torch.no_grad():
        for t in (*model.parameters(), *model.buffers(), *bound):
            if t.is_floating_point():
                factor = torch.rand(t.shape, generator=gen, dtype=torch.float32) + 0.5
                t.mul_(factor.to(device=t.device, dtype=t.dtype))


def changed_attributes(model: Any, held: Mapping[str, Tuple[Any, Any]]) -> Optional[str]:
    """The first of the bound attributes (fqn -> (the tensor, a copy of its values) before the calls) that the
    calls replaced (``self.count = self.count + 1``) or changed in place (``self.count.add_(1)``); else None."""
    import torch

    now = attribute_slots(model, list(held))
    for fqn, (tensor, values) in held.items():
        if fqn not in now or now[fqn][2] is not tensor or not torch.equal(tensor, values):
            return fqn
    return None


def tolerance(dtype: Any, device: str = "cpu") -> float:
    """How close a package's outputs must be to eager's, relative to the outputs' scale (``close``)."""
    import torch

    if device != "cpu" and dtype == torch.float32 and (torch.backends.cudnn.allow_tf32
                                                       or torch.backends.cuda.matmul.allow_tf32):
        # TF32 (cuDNN's default for convolutions): on the weights verify perturbs, ResNet-50's outputs reach
        # 5128 on the H200, eager's own TF32 noise (against full float32) is 3.19 and the package's distance
        # from eager 1.28, 2.5e-4 of the scale; a wrong package is off by the scale
        return 1e-2
    return {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dtype, 1e-3)


def close(got: Any, want: Any, device: str, reference: Any = None) -> None:
    """Raise AssertionError unless ``got`` is within ``tolerance`` of ``want``: relatively, and absolutely
    by that fraction of the largest magnitude in ``want`` (at least 1), so an element near zero in a
    large output is held to the output's precision, not its own.

    ``reference``: the same output from a float32 copy of the model (same weights, same inputs), for a
    bf16/fp16 ``want``. Eager's own rounding then grows with depth (BERT-base in bf16 on the H200: 3 of
    1536 elements 0.024 from eager, past the fixed 0.02), so a correct package, rounding differently, may
    be as far from eager as eager is from float32: the allowed distance adds twice eager's greatest
    distance from the reference. A wrong package (another model's answer) is off by the output's scale,
    far beyond eager's rounding, and is still refused."""
    import torch

    tol = tolerance(want.dtype, device)
    scale = max(1.0, float(want.abs().max())) if want.numel() and want.is_floating_point() else 1.0
    atol = tol * scale + _eagers_own_error(want, reference)
    torch.testing.assert_close(got, want, rtol=tol, atol=atol)


def _low_precision(t: Any) -> bool:
    """Whether ``t`` is a bf16/fp16 tensor: those whose eager rounding a float32 copy measures."""
    import torch

    return isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16)


def float32_reference(model: Any, calls: Sequence[Tuple[Sequence[Any], Mapping[str, Any]]]) -> Optional[list]:
    """The outputs' leaves, call by call, of a float32 copy of a bf16/fp16 ``model`` (same weights; its
    bf16/fp16 inputs in float32), for ``close``'s ``reference``; None for a model already in full precision,
    or when the copy does not fit (out of memory: the fixed tolerance alone then). It costs a float32 copy of
    the weights, briefly, and one forward per call."""
    import torch
    from torch.utils import _pytree as pytree

    if not any(map(_low_precision, (*model.parameters(), *model.buffers()))):
        return None

    def widened(tree: Any) -> Any:
        return pytree.tree_map(lambda t: t.float() if _low_precision(t) else t, tree)

    try:
        wide = copy.deepcopy(model).float()
        with torch.no_grad():
            return [pytree.tree_leaves(wide(*widened(tuple(args)), **widened(dict(kwargs)))) for args, kwargs in calls]
    except (torch.cuda.OutOfMemoryError, MemoryError):
        return None


def differs(got: Any, want: Any, device: str, reference: Optional[Sequence[Any]] = None) -> Optional[str]:
    """None when ``got`` (a package's output) is within ``close`` of ``want`` (eager's), leaf by leaf;
    else what differs, in one line (compiled.py: ``verify=True``'s first-call check). ``reference``: the
    leaves of a float32 copy's output (``float32_reference``), for a bf16/fp16 model."""
    from torch.utils import _pytree as pytree

    got_leaves, want_leaves = pytree.tree_leaves(got), pytree.tree_leaves(want)
    if len(got_leaves) != len(want_leaves):
        return f"{len(got_leaves)} outputs, eager {len(want_leaves)}"
    refs = _matched(reference, len(want_leaves))
    for i, (g, w, r) in enumerate(zip(got_leaves, want_leaves, refs)):
        why = _apart(g, w, device, r) if hasattr(w, "dtype") else None
        if why:
            return f"output {i}: {why}"
    return None


def _matched(reference: Optional[Sequence[Any]], count: int) -> list:
    """The reference's leaves when they pair with eager's ``count`` one by one, else none."""
    return list(reference) if reference is not None and len(reference) == count else [None] * count


def _eagers_own_error(want: Any, reference: Any) -> float:
    """Twice eager's greatest distance from the float32 ``reference`` (``close``); 0 without one."""
    if reference is None or not want.is_floating_point() or not want.numel():
        return 0.0
    if tuple(reference.shape) != tuple(want.shape):
        return 0.0
    return 2 * float((want.double() - reference.double().to(want.device)).abs().max())


def _apart(got: Any, want: Any, device: str, reference: Any = None) -> Optional[str]:
    """``close``'s rule (assert_close's |got - want| <= atol + rtol * |want|, NaN equal to nothing) in
    plain tensor ops: torch.testing's first assert_close costs 1.8 s of imports on the bench CPU, on the
    hit's first call."""
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return f"shape {tuple(got.shape)} {got.dtype}, eager {tuple(want.shape)} {want.dtype}"
    if not want.is_floating_point():
        return None if bool((got == want).all()) else "values differ"
    tol = tolerance(want.dtype, device)
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    g, w = got.double(), want.double()
    off = (g - w).abs() > tol * scale + _eagers_own_error(want, reference) + tol * w.abs()
    off |= g.isnan() | w.isnan()
    if not bool(off.any()):
        return None
    return (f"{int(off.sum())} of {off.numel()} elements beyond {tol:g} of eager "
            f"(greatest difference {float((g - w).abs().max()):.3g}, scale {scale:.3g})")


def verify(path: str, model: Any, example_inputs: Sequence[Any], device: str, *,
           calls: Optional[Sequence[Tuple[Sequence[Any], Mapping[str, Any]]]] = None, imports: Sequence[str] = (),
           cuda_graph: bool = False, timeout: float = 300,
           optional: Sequence[Tuple[Sequence[Any], Mapping[str, Any]]] = (), attributes: Sequence[str] = ()) -> Dict[int, str]:
    """Run the built package in a child process, as a fresh hit would, and compare it with eager; raise on a
    difference or a crash. A child: a loader that dies (torch 2.11's did on the H200) takes only the child.

    Both run on weights the package was not built with (every floating parameter and buffer scaled
    elementwise by a seeded factor in [0.5, 1.5]): a hit runs on whatever weights its process has,
    so a package that kept any of the builder's values (an inlined constant, a folded one) must fail
    here, not in production. ``cuda_graph``: the child captures the run into a CUDA graph and what it
    compares is a replay, on weights changed after the capture (a hit's graph must read the live ones).
    ``calls``: the calls to compare, each (args, kwargs) (every declared shape; default: the example
    inputs alone); ``imports``: the modules of the output's pytree types (export.py), for the child.
    ``optional``: more calls (a declared range's ends: ends.py) whose differences are returned, by their
    index in ``optional``, instead of raised. ``attributes``: the plain tensor attributes the package reads
    live (export.bind_attributes), perturbed and passed like the weights."""
    import torch
    from torch.utils import _pytree as pytree

    required = list(calls) if calls is not None else [(tuple(example_inputs), {})]
    calls = required + list(optional)
    twin = copy.deepcopy(model)
    perturb(twin, attributes)
    held = {fqn: (t, t.clone()) for fqn, (_, _, t) in attribute_slots(twin, attributes).items()}
    with torch.no_grad():
        want = [pytree.tree_leaves(twin(*args, **kwargs)) for args, kwargs in calls]
    changed = changed_attributes(twin, held)
    if changed:
        raise LoadFailed(f"the model's forward changes its attribute {changed}; a package reads it and would not "
                         "change it (torch.compile replays the change)")
    reference = float32_reference(twin, calls) or [None] * len(calls)
    with tempfile.TemporaryDirectory(prefix="cachesvc-aoti-check-") as tmp:
        given, back = os.path.join(tmp, "given.pt"), os.path.join(tmp, "back.pt")
        torch.save({"constants": live_constants(twin, attributes), "calls": [leaves(a, k)[0] for a, k in calls],
                    "imports": list(imports)}, given)
        done = subprocess.run([sys.executable, "-m", f"{__package__}.child", "check", path, given, back, device,
                               "graph" if cuda_graph else ""], capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise LoadFailed(f"the package failed in a fresh process (exit {done.returncode}): {last_line(done)}")
        got = torch.load(back, map_location="cpu")
    failed: Dict[int, str] = {}
    for i, (outputs, expected, wide) in enumerate(zip(got, want, reference)):
        try:
            compare(outputs, expected, device, wide)
        except LoadFailed as exc:
            if i < len(required):
                raise
            failed[i - len(required)] = exc.message
    return failed


def compare(got: Sequence[Any], want: Sequence[Any], device: str, reference: Optional[Sequence[Any]] = None) -> None:
    """Raise LoadFailed unless the package's outputs ``got`` are eager's ``want``, one by one (``close``);
    ``reference``: a float32 copy's outputs, for a bf16/fp16 model (``float32_reference``)."""
    if len(got) != len(want):
        raise LoadFailed(f"the package returned {len(got)} outputs; eager {len(want)}")
    refs = _matched(reference, len(want))
    for g, w, r in zip(got, want, refs):
        try:
            close(g, w.cpu(), device, None if r is None else r.cpu())
        except AssertionError as exc:
            detail = " ".join(str(exc).split())[:300]
            raise LoadFailed(f"the package does not reproduce eager on weights it was not built with: {detail}") from None
