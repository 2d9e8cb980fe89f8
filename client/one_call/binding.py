"""Which tensors a hit's package runs on, and whether they are still the model's.

The package reads the tensors it was bound to (runner.py: ``user_managed``), so in-place updates
(``load_state_dict`` without ``assign``, ``copy_``, an optimizer step) are seen as they are. A
replaced tensor is not: ``load_state_dict(sd, assign=True)``, ``param.data = t`` and
``module.weight = nn.Parameter(...)`` leave the package on the old storage, which it keeps alive.
So before each call the binding checks that every slot (a module's ``_modules``, ``_parameters`` or
``_buffers`` entry, a shared tensor under each of its names) still holds the object it was bound to:
that sees a swapped submodule and an untied weight, and that sees ``module.weight = nn.Parameter(...)``,
``load_state_dict(sd, assign=True)`` and a tensor written straight into the dict
(``m._parameters["weight"] = p``, which no registration hook reports); and that every bound tensor
still has its storage (``.data =`` keeps the object and swaps the storage). One ``dict.get`` and one
``data_ptr()`` per tensor (bench/probes/binding_check.py). A change is rebound when the new tensor has the
bound one's shape, strides, dtype and device, else the call goes to torch.compile (compiled.py logs
either once).

A plain tensor attribute of the model or a submodule that the trace read (GPT-J's sinusoidal table on
transformers 4.57) is bound the same way, by its path, once the proof names it (``bind_attributes``): its
slot is the module's ``__dict__``.
"""
from __future__ import annotations

import operator
from typing import Any, Dict, List, Optional, Sequence, Tuple


def live_constants(model: Any, attributes: Sequence[str] = ()) -> Dict[str, Any]:
    """The model's parameters and buffers by fully qualified name (what the package's constants are called),
    and the plain tensor attributes at the paths ``attributes`` (the proof's: proof/capture.py).

    Every name of a shared tensor: a tied weight (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``)
    is a constant of the package under each name, and ``named_parameters()`` alone gives only the first."""
    named = (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False))
    found = {name: t.detach() for name, t in named}
    found.update((fqn, t.detach()) for fqn, (_, _, t) in attribute_slots(model, attributes).items())
    return found


def attribute_slots(model: Any, attributes: Sequence[str]) -> Dict[str, Tuple[dict, str, Any]]:
    """fqn -> (the module's ``__dict__``, the name there, the tensor) for each of ``attributes`` that is a plain
    tensor attribute of the model or a submodule now (a path that is not: left out, so a package that wants it
    cannot load: runner.py)."""
    import torch

    out = {}
    for fqn in attributes:
        prefix, _, name = fqn.rpartition(".")
        try:
            module = model.get_submodule(prefix)
        except (AttributeError, TypeError):
            continue
        store = vars(module)
        value = store.get(name)
        if type(value) is torch.Tensor:
            out[fqn] = (store, name, value)
    return out


def _slots(model: Any, attributes: Sequence[str] = ()) -> List[Tuple[str, dict, str]]:
    """(fqn, the dict holding it, its name there) for every submodule, parameter and buffer, a shared one
    under each of its names, and each bound plain attribute (its module's ``__dict__``): untying a tied weight
    replaces the object in one slot only, and swapping a submodule (``model.fc = nn.Linear(...)``) leaves the
    old module's own dicts as they were."""
    out = []
    for prefix, module in model.named_modules(remove_duplicate=False):
        for store in (module._modules, module._parameters, module._buffers):
            for name, t in store.items():
                if t is not None:
                    out.append((f"{prefix}.{name}" if prefix else name, store, name))
    out.extend((fqn, store, name) for fqn, (store, name, _) in attribute_slots(model, attributes).items())
    return out


def _layout(t: Any) -> tuple:
    return tuple(t.shape), tuple(t.stride()), t.dtype, t.device


class Binding:
    """The live tensors given to a runner: ``constants`` (fqn -> tensor), and ``changed()``."""

    def __init__(self, model: Any, attributes: Sequence[str] = ()):
        self.model = model
        self.attributes = list(attributes)
        self.constants: Dict[str, Any] = live_constants(model, self.attributes)
        self._take()

    def bind_attributes(self, attributes: Sequence[str]) -> None:
        """Also bind these plain tensor attributes (the proof's, known once it is loaded)."""
        if attributes:
            self.attributes = sorted(set(self.attributes) | set(attributes))
            self.constants = live_constants(self.model, self.attributes)
            self._take()

    def _take(self) -> None:
        import torch

        self._slots = _slots(self.model, self.attributes)
        # the dicts and names apart, for map(): the check is per call, so no Python loop per tensor
        self._stores = [store for _, store, _ in self._slots]
        self._names = [name for _, _, name in self._slots]
        self._objects = list(map(dict.get, self._stores, self._names))
        self._data_ptr = torch.Tensor.data_ptr
        tensors = [(fqn, t) for (fqn, _, _), t in zip(self._slots, self._objects) if isinstance(t, torch.Tensor)]
        self._tensor_fqns = [fqn for fqn, _ in tensors]
        self._tensors = [t for _, t in tensors]
        self._ptrs = list(map(self._data_ptr, self._tensors))
        self._every = list(range(len(self._tensors)))
        # torch's own comparison of storage pointers, in C++ (cudagraph trees check their static inputs with
        # it): CUDA builds have it. It takes the list as it is; the Python loop is the fall-back.
        self._ptrs_equal = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)

    def held_in_slots(self, fqns: Any) -> List[Any]:
        """The objects the slots of these parameters and buffers held when bound (fqns it does not know: left out)."""
        return [t for fqn, t in zip(self._tensor_fqns, self._tensors) if fqn in fqns]

    def changed(self, slots: bool = True) -> Optional[str]:
        """None while every slot holds the object and storage it was bound to; else the first changed fqn.
        ``slots=False``: the storage only, where the proof's trees pin the slots' objects (proof/pins.py)."""
        # a slot holds another object (or None); no list is made on the way (this runs before every call)
        if slots and any(map(operator.is_not, map(dict.get, self._stores, self._names), self._objects)):
            now = map(dict.get, self._stores, self._names)
            return next(fqn for (fqn, _, _), obj, was in zip(self._slots, now, self._objects) if obj is not was)
        if self._ptrs_equal is not None and self._ptrs_equal(self._tensors, self._ptrs, self._every):
            return None
        ptrs = list(map(self._data_ptr, self._tensors))
        # None also where torch's comparison said otherwise and the pointers are the same (it never should)
        return next((fqn for fqn, now_ptr, was in zip(self._tensor_fqns, ptrs, self._ptrs) if now_ptr != was), None)

    def refresh(self) -> Optional[str]:
        """Take the model's tensors as they are now. None when each has its bound one's layout (the
        package can run on them: the caller rebinds it to ``constants``); else why not."""
        now = live_constants(self.model, self.attributes)
        if sorted(now) != sorted(self.constants):
            return "the model's parameters and buffers are not the ones it was built with"
        for fqn, t in now.items():
            if _layout(t) != _layout(self.constants[fqn]):
                was = _layout(self.constants[fqn])
                return f"{fqn} was replaced by a tensor of shape {tuple(t.shape)} {t.dtype} (built for {was[0]} {was[2]})"
        self.constants = now
        self._take()
        return None
