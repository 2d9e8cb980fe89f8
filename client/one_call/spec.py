"""What a precompiled artifact was built for: the inputs of each call and the model's structure.

``compile()`` serves a call from the artifact only when the call matches the
spec exactly (count, shapes, strides, dtypes, devices, requires_grad, the
model's training flag, and no autograd graph wanted); anything else goes to
torch.compile. The structure fingerprint (parameter and buffer names, shapes,
dtypes, devices, and the module tree's classes) is part of the cache key, so a
model changed after publish misses instead of loading an artifact made for
another model. Weights are not part of it: the artifact runs on the live
model's tensors (runner.py).

torch is imported by the caller; these functions only use the objects given.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

FINGERPRINT_CHARS = 16  # of the sha256: the tag's value


def structure_fingerprint(model: Any) -> str:
    """A short hash of the model's module tree and of every parameter's and buffer's name, shape, dtype, device."""
    h = hashlib.sha256()
    for name, module in model.named_modules():
        h.update(f"m {name} {type(module).__module__}.{type(module).__qualname__}\n".encode())
    for kind, tensors in (("p", model.named_parameters()), ("b", model.named_buffers())):
        for name, t in tensors:
            h.update(f"{kind} {name} {tuple(t.shape)} {t.dtype} {t.device.type}\n".encode())
    return h.hexdigest()[:FINGERPRINT_CHARS]


@dataclass(frozen=True)
class TensorSpec:
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    dtype: Any
    device: Any
    requires_grad: bool

    @classmethod
    def of(cls, t: Any) -> "TensorSpec":
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, t.device, bool(t.requires_grad))

    def mismatch(self, t: Any) -> Optional[str]:
        if tuple(t.shape) != self.shape:
            return f"shape {tuple(t.shape)}, built for {self.shape}"
        if t.dtype != self.dtype:
            return f"dtype {t.dtype}, built for {self.dtype}"
        if t.device != self.device:
            return f"device {t.device}, built for {self.device}"
        if bool(t.requires_grad) != self.requires_grad:
            return f"requires_grad={t.requires_grad}, built for {self.requires_grad}"
        if tuple(t.stride()) != self.stride:
            return f"strides {tuple(t.stride())}, built for {self.stride}"
        return None


class InputSpec:
    """The positional tensor inputs an artifact was built for, and the model's training flag then."""

    def __init__(self, example_inputs: Sequence[Any], training: bool):
        self.tensors = tuple(TensorSpec.of(t) for t in example_inputs)
        self.training = training

    def mismatch(self, args: Sequence[Any], kwargs: dict, model: Any) -> Optional[str]:
        """None when the call matches the spec; else the reason, for the fallback's log line."""
        if kwargs:
            return f"keyword arguments {sorted(kwargs)} (built for positional tensors only)"
        if len(args) != len(self.tensors):
            return f"{len(args)} inputs, built for {len(self.tensors)}"
        if bool(model.training) != self.training:
            return f"model.training={model.training}, built with {self.training}"
        for i, (arg, spec) in enumerate(zip(args, self.tensors)):
            why = spec.mismatch(arg) if hasattr(arg, "stride") and hasattr(arg, "dtype") else "not a tensor"
            if why:
                return f"input {i}: {why}"
        return None


def tensor_inputs(example_inputs: Sequence[Any]) -> Optional[str]:
    """None when every example input is a tensor (what the precompiled routes take); else why not."""
    import torch

    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            return f"example input {i} is a {type(x).__name__}, not a tensor"
    return None


def grad_wanted(args: Sequence[Any], model: Any) -> Optional[str]:
    """The reason when this call would build an autograd graph (a precompiled inference artifact cannot)."""
    import torch

    if not torch.is_grad_enabled():
        return None
    if any(getattr(a, "requires_grad", False) for a in args) or any(p.requires_grad for p in model.parameters()):
        return "autograd is on and the model has parameters that require grad (call it under torch.no_grad() " \
               "or torch.inference_mode() to use the precompiled artifact)"
    return None
