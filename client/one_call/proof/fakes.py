"""torch's guard state unpickled with one fake-tensor mode for all of its tensors, not a new one per tensor.

A package's guard state holds a fake tensor for each tensor the trace guarded on: every parameter and
buffer of the model. torch's ``GuardsStatePickler._unpickle_tensor`` (torch 2.11 to 2.13) makes a new
``FakeTensorMode`` and converter for each of them, and a mode's set-up (it records the stack it was made
on) is most of the unpickling: on the bench CPU about 0.4 ms a tensor, 0.15 s of regnet_y_400mf's proof on
an H100 host. A trace holds all of its fakes in one mode; ``one_mode(mode)`` makes the unpickling in this
thread do the same, with the converter torch uses, so each fake's sizes, strides, dtype, device, dispatch
keys, requires_grad and grad are what they would have been.

The replacement is installed once, on the class, and does torch's own per-tensor work for every caller
outside a ``one_mode`` block (another thread loading torch's own precompiled code, say). It is installed
only where torch's function takes the arguments it was written for; elsewhere nothing changes.
"""
from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Any, Iterator

#: the arguments torch's ``_unpickle_tensor`` takes in the versions this was written against
ARGUMENTS = ("meta_tensor", "device", "pytype", "dispatch_keys_raw", "grad")

_local = threading.local()
_install_lock = threading.Lock()
_installed = False


@contextlib.contextmanager
def one_mode(mode: Any) -> Iterator[None]:
    """Inside, in this thread: torch's guard state's tensors become fakes of ``mode`` (a FakeTensorMode)."""
    if not _install():
        yield
        return
    from torch._subclasses.fake_tensor import FakeTensorConverter

    outer = getattr(_local, "shared", None)
    _local.shared = (mode, FakeTensorConverter())
    try:
        yield
    finally:
        _local.shared = outer


def _install() -> bool:
    """Put the replacement on torch's pickler, once; False where torch's function is not the one it replaces."""
    global _installed
    with _install_lock:
        if _installed:
            return True
        from torch._dynamo.guards import GuardsStatePickler

        original = GuardsStatePickler.__dict__.get("_unpickle_tensor")
        if not isinstance(original, classmethod):
            return False
        if tuple(inspect.signature(original.__func__).parameters)[1:] != ARGUMENTS:
            return False
        GuardsStatePickler._unpickle_tensor = classmethod(_replacement(original.__func__))
        _installed = True
        return True


def _replacement(torchs: Any) -> Any:
    def _unpickle_tensor(cls, meta_tensor, device, pytype, dispatch_keys_raw, grad):
        shared = getattr(_local, "shared", None)
        if shared is None:
            return torchs(cls, meta_tensor, device, pytype, dispatch_keys_raw, grad)
        import torch

        mode, converter = shared
        fake = converter.from_meta_and_device(mode, meta_tensor, device, pytype,
                                              torch._C.DispatchKeySet.from_raw_repr(dispatch_keys_raw))
        fake.grad = grad
        return fake

    return _unpickle_tensor
