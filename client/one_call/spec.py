"""What a precompiled artifact was built for: the model's structure, and what a served call must not want.

``compile()`` serves a call from the artifact only when the call matches what
it was built for (calls.py: arguments, shapes declared, the training flag) and
wants no autograd graph; anything else goes to torch.compile. The structure
fingerprint (parameter and buffer names, shapes, dtypes, devices, and the module
tree's classes) is part of the cache key, so a model changed after publish
misses instead of loading an artifact made for another model. Weights are not part of it: the artifact runs on the live
model's tensors (runner.py).

torch is imported by the caller; these functions only use the objects given.
"""
from __future__ import annotations

import hashlib
from typing import Any, Dict, Mapping, Optional, Sequence

from . import identity

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


def key_tags(model: Any, tags: Optional[Mapping[str, str]], mode: Optional[str], route: str,
             options: Mapping[str, Any]) -> Dict[str, str]:
    """The key's tags: the caller's, the mode and route, the structure, and the code and config (identity.py):
    same names and shapes but another forward or setting is another key."""
    return {**dict(tags or {}), "mode": mode or "default", "compile": route,
            "structure": structure_fingerprint(model),
            "code": identity.code_fingerprint(model), "config": identity.config_fingerprint(model),
            "options": _options_digest(mode, options)}


def _options_digest(mode: Optional[str], kwargs: Mapping[str, Any]) -> str:
    text = repr((mode or "default", sorted((k, repr(v)) for k, v in kwargs.items())))
    return hashlib.sha256(text.encode()).hexdigest()[:12]
