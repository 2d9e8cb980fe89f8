"""A package opened for serving, and the checks it makes before each call.

One ``Slot`` per package a process serves: the example's (the key ``compile()`` was called with) and
each learned shape's (learned.py). Opening one checks that this host can run it, loads its proof (the
build's guards, compared with this model: proof/) and opens it on the model's live tensors. Before a
call it serves, the call must match what the package was built for (calls.py), must not want autograd,
the proof must hold for it, and the model's tensors must be the ones it runs on (a replaced one is
rebound, or the slot is dead for good).
"""
from __future__ import annotations

import itertools
import logging
import time
from typing import Any, Dict, List, Optional, Tuple

from . import calls, libraries, proof as proof_mod, spec as spec_mod, support
from .binding import Binding
from .runner import Runner
from .. import settings
from ..errors import CacheClientError

log = logging.getLogger("cachesvc_client")


class Slot:
    """An opened package: ``spec`` (what it serves), ``runner``, ``binding`` (the live tensors), ``proof``."""

    def __init__(self, shape: str, spec: calls.CallSpec, runner: Runner, binding: Binding, proof: proof_mod.Proof,
                 report: Any):
        self.shape, self.spec, self.runner, self.binding, self.proof, self.report = \
            shape, spec, runner, binding, proof, report
        #: calls this package served in this process
        self.calls = 0
        #: set once the package cannot run on the model's tensors any more: never tried again
        self.dead = False
        #: the seconds opening it took: "proof" (load and compare), "bind" (the live tensors), "load" (the runner)
        self.phases: Dict[str, float] = {}
        #: cuDNN, readied beside the proof where it convolves (libraries.py): waited for before its first run
        self.libraries = libraries.Warmup()
        #: whether the binding walks the slots before each call: not while the proof's trees pin every tensor
        #: the package runs on (proof/pins.py), from the first replaced one on
        self.walks_slots = not (proof.pins_tensors and
                                {id(t) for t in binding.held_in_slots(set(runner.constant_fqns))} <= proof.pinned())

    def refusal(self, args: tuple, kwargs: dict, model: Any, name: str) -> Tuple[Optional[str], bool, Optional[List[Any]]]:
        """``(why not, declared, flat)``: why this package does not serve the call (None: it does), whether
        the call matched the declared inputs, and the call's tensors in the package's order."""
        why, flat = self.spec.match(args, kwargs, model)
        declared = why is None
        why = why or spec_mod.grad_wanted(flat, model) or self._unproven(args, kwargs) or self._stale(name)
        return why, declared, flat

    def _unproven(self, args: tuple, kwargs: dict) -> Optional[str]:
        """None while the package's guards hold for this call (proof/); else the first that fails."""
        try:
            if self.proof.holds(args, kwargs):
                return None
            if self.proof.pins_tensors and self.binding.changed() is not None:
                # a tensor replaced in its slot fails its pin: the trees again without pins, and the binding's
                # walk before each call from now on (_stale rebinds what changed): one rebuild, not one a swap
                self.proof, self.walks_slots = self.proof.unpinned(), True
                if self.proof.holds(args, kwargs):
                    return None
        except proof_mod.NoProof as exc:  # the rebuilt trees: the model is no longer the build's, for good
            self.dead = True
            return f"the package's guards fail for this call: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - a check that cannot run proves nothing: torch.compile serves
            return f"the package's guards could not be checked for this call: {type(exc).__name__}: {exc}"
        return f"the package's guards fail for this call: {self.proof.why_not(args, kwargs)}"

    def _stale(self, name: str) -> Optional[str]:
        """None while the package runs on the model's tensors (rebinding replaced ones); else why not."""
        changed = self.binding.changed(slots=self.walks_slots)
        if changed is None:
            return None
        why = self.binding.refresh()
        if why is None:
            try:
                self.proof.refresh()  # a swapped submodule has hook dicts of its own
                self.runner.rebind(self.binding.constants)
                log.info("cachesvc compile %s: %s was replaced; the package now runs on the new tensors", name, changed)
                return None
            except CacheClientError as exc:
                why = exc.message
        self.dead = True  # for good: the package cannot run on these tensors
        return f"the model's tensors were replaced ({changed}): {why}"


def open_slot(shape: str, report: Any, model: Any, spec: calls.CallSpec, device: str,
              cuda_graph: bool) -> Tuple[Optional[Slot], str]:
    """``(slot, "")`` for the package ``report`` restored, or ``(None, why not)``."""
    why = support.check_host(report.meta, device)
    if why:
        return None, why
    marks = [time.monotonic()]
    warmup = libraries.Warmup()
    if settings.current().library_warmup:  # beside the proof: cuDNN, which its first run would ready
        warmup.start(report.artifacts[0], itertools.chain(model.parameters(), model.buffers()), device)
    try:
        # the binding (cheap), then the proof: a package that cannot vouch for this model is not opened. The
        # trees pin the objects the binding holds (proof/pins.py); one replaced between the two fails its pin
        binding = Binding(model)
        marks.append(time.monotonic())
        checked = proof_mod.Proof.load(proof_mod.read(report.artifacts[0]), model,
                                       pin_tensors=settings.current().proof_pins)
        binding.bind_attributes(checked.attributes)  # the plain tensor attributes the package reads, by path
        marks.append(time.monotonic())
        runner = Runner(report.artifacts[0], binding.constants, device, cuda_graph=cuda_graph)
        marks.append(time.monotonic())
        spec.narrow(calls.parse_served(str((report.meta or {}).get(support.SERVED, ""))))
    except CacheClientError as exc:
        warmup.wait()  # torch.compile comes next: nothing of ours beside its first call
        return None, exc.message
    if runner.in_spec != spec.structure:  # the key's shape text matched, the package not
        warmup.wait()
        return None, "the package's inputs are not this call's arguments"
    slot = Slot(shape, spec, runner, binding, checked, report)
    slot.libraries = warmup
    slot.phases = {phase: round(end - start, 4) for phase, start, end in zip(("bind", "proof", "load"), marks, marks[1:])}
    return slot, ""
