"""Pins: the module tensors a trace read, checked by torch's guard tree as the very objects the package runs on.

The package reads the tensors it was bound to (binding.py). A tensor replaced in its slot
(``m.weight = nn.Parameter(...)``, ``load_state_dict(assign=True)``, ``m._parameters["w"] = t`` as accelerate's
loaders and ``functional_call`` write it, a swapped submodule's own) leaves the package on the old one. The
binding's walk of every slot sees that, in Python, before each call: about a tenth of a microsecond a slot,
and GPT-2 large has 900. The guard tree can see it instead: where the trace read a module tensor, Dynamo
guards its layout (TENSOR_MATCH on its ``_parameters``/``_buffers`` slot), and each such slot gets one more
leaf there, an identity check against the object the slot holds at load (torch's ID_MATCH leaf), run in C++
with the rest of the tree: a pointer comparison a tensor, where the walk makes a Python call a slot
(bench/probes/per_call_split.py times both).

A replaced tensor fails its pin. The slot (slot.py) then walks the slots as before, rebinds, and loads the
proof again without pins: the walk runs before every call from then on, so a model whose weights are
swapped pays one rebuild, not one per swap. ``.data =`` swaps the storage and keeps the object: the
binding's pointer check, which runs either way, sees that.

The pinned objects are held here while the tree lives: an id is checked, and no other object may take it.
"""
from __future__ import annotations

import builtins
import functools
from typing import Any, List

from .guards import ATTRIBUTE, SLOT, first_line


class Pins:
    """The pins of one tree: ``guards(graph_guards)`` makes them for torch's tree builder, which calls each
    with itself; ``objects`` holds what they pinned; ``failed`` says why one could not be made (then the
    caller trusts none of them)."""

    def __init__(self, live_locals: dict, live_globals: dict):
        self._scope = {"L": live_locals, "G": live_globals, "__builtins__": builtins.__dict__}
        #: the values read on the way to each slot, shared by the pins of one tree (a pin walks from ``self``
        #: through every module above its slot: alone, each walk read them all again)
        self._values: dict = {}
        self._closure: Any = None
        self.objects: List[Any] = []
        self.failed = ""

    def guards(self, graph_guards: Any) -> List[Any]:
        """One guard per module tensor slot the trace guarded the layout of (a parameter's, a buffer's, a plain
        tensor attribute's the package is bound to)."""
        from torch._guards import Guard

        return [Guard(g.originating_source, functools.partial(PIN_IDENTITY, self)) for g in graph_guards
                if g.create_fn_name() == "TENSOR_MATCH" and (SLOT.search(g.name) or ATTRIBUTE.match(g.name))]

    @property
    def held(self) -> bool:
        """Whether every pin was made (none failed): the tree then checks every module tensor it reads."""
        return not self.failed


def PIN_IDENTITY(pins: Pins, builder: Any, guard: Any) -> None:  # noqa: N802 - named as torch's guard kinds are
    """The identity leaf on the slot's node of the tree being built (``builder``: torch's GuardBuilder)."""
    from torch._dynamo.guards import _get_closure_vars

    try:
        if pins._closure is None:
            pins._closure = _get_closure_vars()
        value = guard.originating_source.get_value(pins._scope, pins._closure, pins._values)
        manager = builder.get_guard_manager(guard)
        code = [f"___check_obj_id({guard.name}, {id(value)})  # the tensor the package is bound to"]
        try:
            manager.add_id_match_guard(id(value), code, None)
        except TypeError:  # a torch whose leaves take no user stack
            manager.add_id_match_guard(id(value), code)
        pins.objects.append(value)
    except Exception as exc:  # noqa: BLE001 - no pin: the binding walks the slots instead (Proof.load)
        pins.failed = pins.failed or f"{guard.name}: {first_line(exc)}"
