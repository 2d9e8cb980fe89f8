"""The restart's side of a proof: compare it with the live model, rebuild the guard tree, check each call.

``Proof.load`` compares every entry's portable descriptions, traced source lines and pinned environment
with this process, then builds torch's guard tree over the live objects (``CheckFunctionManager``, as
torch's own AOT precompile loads guards); ``Proof.holds`` runs the trees before each served call.
"""
from __future__ import annotations

import builtins
import dataclasses
import functools
import importlib
import linecache
import logging
import os
import sys
import time
import types
from typing import Any, Dict, List, Mapping, Optional

from . import bytecode, fakes, portable, templates, tracelog
from .container import NoProof, decode
from .container import attributes as container_attributes
from .guards import CALL_LOCALS, GLOBAL_KINDS, INPUT, first_line, key, lines_digest, root, short
from .hooks import HOOK_KIND, Hooks
from .pins import Pins

log = logging.getLogger("cachesvc_client")


class Proof:
    """A package's guards, holding for the live ``model``: ``holds(args, kwargs)`` before each served call
    (one tree per entry: a call is served when any holds). ``Proof.load`` raises NoProof (why, in one
    line) when the live state is not the build's."""

    def __init__(self, model: Any, managers: List[Any], guards: int, seconds: float,
                 phases: Optional[Dict[str, float]] = None, hooks: Optional["Hooks"] = None,
                 pins: Optional[List[Pins]] = None, data: bytes = b""):
        self.model, self._managers, self.guards, self.load_seconds = model, managers, guards, seconds
        #: where ``load_seconds`` went: imports, sources, unpickle, compare, tree, check (summed over the entries)
        self.phases = dict(phases or {})
        self._hooks = hooks
        self._pins, self._data = list(pins or ()), data
        #: whether every tree checks every module tensor it reads as the object it was loaded on (pins.py)
        self.pins_tensors = bool(self._pins) and all(p.held for p in self._pins)
        #: the model's plain tensor attributes the package is bound to, by path (capture._record_inputs)
        self.attributes: List[str] = []

    def pinned(self) -> set:
        """The ids of the objects every tree pins (those of the first tree: each entry traced the same model)."""
        return {id(o) for o in self._pins[0].objects} if self.pins_tensors else set()

    @classmethod
    def load(cls, data: bytes, model: Any, *, pin_tensors: bool = True) -> "Proof":
        if not pin_tensors:
            return cls._load(data, model, False)
        try:
            return cls._load(data, model, True)
        except NoProof as exc:  # as it would be without pins? (a torch whose tree builder takes no pin: serve)
            proof = cls._load(data, model, False)
            log.debug("cachesvc proof: the trees pin no tensors (with pins: %s)", exc.message)
            return proof

    @classmethod
    def _load(cls, data: bytes, model: Any, pin_tensors: bool) -> "Proof":
        import torch

        started = time.monotonic()
        header, entries = decode(data, torch.__version__)
        _check_environment(header["environ"])
        managers, why, phases, hooks, pins = [], "", {}, Hooks(model), []
        for entry, state in entries:
            entry_pins: Optional[List[Pins]] = [] if pin_tensors else None
            try:
                with templates.compiled_once():  # the comparison and torch's tree read every source
                    managers.append(_rebuild(entry, state, model, phases, hooks, entry_pins))
                pins.extend(entry_pins or ())
            except NoProof as exc:
                why = why or exc.message
            except Exception as exc:  # noqa: BLE001 - a state torch cannot rebuild here is no proof
                why = why or f"the guards could not be rebuilt here: {first_line(exc)}"
            if not managers:  # the example's own entry comes first: without it nothing serves
                raise NoProof(why)
        failed = next((p.failed for p in pins if not p.held), "")
        if failed:  # a tree with some pins: trees without any, and the binding's walk
            log.debug("cachesvc proof: the trees pin no tensors (%s)", failed)
            return cls._load(data, model, False)
        guards = sum(int(entry.get("guards", 0)) for entry, _ in entries)
        proof = cls(model, managers, guards, time.monotonic() - started, phases, hooks, pins, data)
        proof.attributes = container_attributes(entry for entry, _ in entries)
        return proof

    def unpinned(self) -> "Proof":
        """This proof's trees built again over the model as it is now, pinning no tensor (a tensor was replaced
        in its slot: the binding walks the slots from now on). Raises NoProof when the model no longer
        matches the build."""
        return Proof.load(self._data, self.model, pin_tensors=False)

    def holds(self, args: tuple, kwargs: dict) -> bool:
        """Whether the package computes what the model would for this call, as torch.compile decides (and
        no module has gained a hook since the build)."""
        if self._hooks is not None and self._hooks.why():
            return False
        frame = {"self": self.model, "args": args, "kwargs": kwargs}
        return any(manager.check(frame) for manager in self._managers)

    def refresh(self) -> None:
        """The model's modules were swapped (binding.py saw it): find its hook dicts again."""
        if self._hooks is not None:
            self._hooks.refresh()

    def why_not(self, args: tuple, kwargs: dict) -> str:
        """The first guard of the example's entry that fails for this call (torch's words), for the log."""
        hooked = self._hooks.why() if self._hooks is not None else None
        if hooked:
            return hooked
        try:
            verbose = self._managers[0].check_verbose({"self": self.model, "args": args, "kwargs": kwargs})
            parts = list(getattr(verbose, "verbose_code_parts", ()) or ())
            return (parts[0] if parts else str(verbose)).strip()[:300]
        except Exception as exc:  # noqa: BLE001 - only the wording of a log line
            return f"a guard failed ({type(exc).__name__})"


def _check_environment(environ: Mapping[str, Any]) -> None:
    for name, value in environ.items():
        if os.environ.get(name) != value:
            raise NoProof(f"the environment variable {name} is {_shown(os.environ.get(name))} here; the package "
                          f"was built with it {_shown(value)}")


def _shown(value: Optional[str]) -> str:
    return "unset" if value is None else f"= {short(repr(value))}"


#: Dynamo's settings for the trees built here. skip_nnmodule_hook_guards (torch's default) leaves out the
#: guards that a module has no hooks (about a third of a transformer's per-call check): ``Hooks`` checks
#: those instead, at load and whenever a hook has been registered anywhere since. Object aliasing
#: (``a is b``) is checked in C++, not by Python lambdas (the same checks; 22 lambdas were a third of
#: GPT-2's per-call check). Shape guards stay Python (torch's default): C++ ones would run a compiler at
#: every start.
TREE_CONFIG = {"skip_nnmodule_hook_guards": True, "use_lamba_guard_for_object_aliasing": False,
               "enable_cpp_symbolic_shape_guards": False}


def _rebuild(header: dict, state_bytes: bytes, model: Any, phases: Dict[str, float], hooks: "Hooks",
             pins: Optional[List[Pins]] = None) -> Any:
    """One entry's guard tree over the live ``model``, after its descriptions and sources compared equal; where
    ``pins`` is a list, the tree pins its module tensors and the list gets them (pins.py). ``phases`` adds where
    the seconds went ("imports": Dynamo's, the first time; most of a small model's proof)."""
    started = time.perf_counter()
    from torch._dynamo import config as dynamo_config, convert_frame
    from torch._dynamo.guards import CheckFunctionManager
    from torch._dynamo.mutation_guard import install_generation_tagging_init
    from torch._dynamo.output_graph import OutputGraphCommon

    imported = time.perf_counter() - started
    started = _phase(phases, "imports", started)
    bytecode.warn_if_slow(imported)
    _check_sources(header["sources"])
    # Dynamo wraps nn.Module.__init__ and __setstate__ the first time it traces (mutation_guard.py): the
    # build's classes were described wrapped, so these are too
    install_generation_tagging_init()
    started = _phase(phases, "sources", started)
    state = _unpickled(state_bytes)
    started = _phase(phases, "unpickle", started)
    fn, _ = convert_frame.get_traced_fn(model.__call__)
    graph = state.output_graph
    live_globals = fn.__globals__
    _install_aliases(graph, live_globals)
    live_locals = dict(graph.local_scope)
    live_locals["self"] = model
    with portable.session():
        _compare(graph.guards, header["described"], live_locals, live_globals)
    hooks.add([g.originating_source for g in graph.guards if g.create_fn_name() == HOOK_KIND], live_locals,
              live_globals)
    started = _phase(phases, "compare", started)
    pinned = Pins(live_locals, live_globals) if pins is not None else None
    live = dataclasses.replace(graph, local_scope=live_locals, global_scope=live_globals,
                               _guards=_read_live(graph.guards, pinned.guards(graph.guards) if pinned else []))
    try:
        with dynamo_config.patch(**TREE_CONFIG), tracelog.dropped_records():
            check = CheckFunctionManager(fn.__code__, OutputGraphCommon(live),
                                         shape_code_parts=state.shape_code_parts, runtime_global_scope=live_globals)
    except AssertionError as exc:  # torch checks the new tree on the frame's own values: a structural guard failed
        raise NoProof(f"a guard fails on this model: {first_line(exc)}") from exc
    started = _phase(phases, "tree", started)
    _check_now(check.guard_manager, live_locals)
    _phase(phases, "check", started)
    if pinned is not None:
        pins.append(pinned)
    return check.guard_manager


def _unpickled(state_bytes: bytes) -> Any:
    """torch's guard state, unpickled where Dynamo expects to be: some sources install a guard when made
    (``ImportSource``, for a module a 4.x transformers model imports inside its forward), which needs a
    trace's context; here a throwaway one takes it (the guard itself is in the state). Its fake-tensor mode
    holds every tensor's fake, as a trace's does, instead of one mode made per tensor (fakes.py)."""
    from torch._dynamo.package import load_guards_state
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    with tracing(TracingContext(mode)), fakes.one_mode(mode):
        return load_guards_state(state_bytes)


def _phase(phases: Dict[str, float], name: str, started: float) -> float:
    now = time.perf_counter()
    phases[name] = phases.get(name, 0.0) + now - started
    return now


def _check_now(manager: Any, frame: dict) -> None:
    """The tree, checked once at load on the live model and stand-ins for the build's inputs, under no grad as
    the trace ran: a structural guard that fails here (an instance ``forward``, a hook, a missing attribute)
    fails every call, so the package is not used at all. A failure of the process's global state (this
    thread's grad or autocast mode now) or of an input says nothing of later calls, each checked anyway."""
    import torch
    from torch.utils import _pytree as pytree

    live = dict(frame, **{k: pytree.tree_map(_stand_in, frame[k]) for k in CALL_LOCALS if k in frame})
    with torch.no_grad():
        if manager.check(live):
            return
        verbose = manager.check_verbose(live)
    parts = list(getattr(verbose, "verbose_code_parts", ()) or ())
    why = (parts[0] if parts else str(verbose)).strip()
    if not why.startswith("GLOBAL_STATE") and not any(f"L['{k}']" in why for k in CALL_LOCALS):
        raise NoProof(f"a guard fails on this model: {why[:300]}")


def _stand_in(value: Any) -> Any:
    """A real tensor of a (fake) input's layout, dtype, device, grad flag and inference-ness; else the value."""
    import contextlib

    import torch

    if not isinstance(value, torch.Tensor):
        return value
    keys = getattr(value, "dispatch_keys", None) or torch._C._dispatch_keys(value)
    inference = not keys.has(torch._C.DispatchKey.ADInplaceOrView)
    with torch.inference_mode() if inference else contextlib.nullcontext():
        real = torch.empty_strided(tuple(int(s) for s in value.shape), tuple(int(s) for s in value.stride()),
                                   dtype=value.dtype, device=value.device)
    return real.requires_grad_(True) if value.requires_grad else real


def _read_live(guards: Any, extra: List[Any]) -> Any:
    """The guards, each reading its value from the live objects: Dynamo hands some a value it computed
    (a numpy scalar's tensor), which torch's pickler leaves behind as missing. Their stacks are dropped:
    the source lines in a failed guard's text cost a fifth of the tree's build. Then ``extra``. The hook
    dicts' guards are left out: under TREE_CONFIG torch's builder makes nothing of them (``Hooks`` checks
    them), yet sorts and visits each (a third of a RegNet's guards)."""
    import functools

    from torch._dynamo.guards import _Missing
    from torch._guards import GuardsSet

    skipped = HOOK_KIND if TREE_CONFIG["skip_nnmodule_hook_guards"] else None
    kept = []
    for guard in guards:
        if guard.create_fn_name() == skipped:
            continue
        guard.user_stack = None
        fn = guard.create_fn
        if isinstance(fn, functools.partial) and isinstance(fn.keywords.get("value"), _Missing):
            keywords = {k: v for k, v in fn.keywords.items() if k != "value"}
            guard.create_fn = functools.partial(fn.func, *fn.args, **keywords)
        kept.append(guard)
    return GuardsSet(type(guards.inner)(kept + list(extra)))


def _install_aliases(graph: Any, live_globals: dict) -> None:
    """The globals Dynamo adds to the traced frame's module for the modules it reached (``__import_x``,
    ``_<id>_c0``) and for the builtins dict: a restarted process has not traced, so they are put there
    as Dynamo would. Only modules travel (by name: ``_only_the_call_pickled``)."""
    from torch._dynamo.output_graph import get_builtins_dict

    for name, value in dict(graph.global_scope).items():
        # the module as this process has it now (the pickle imported it by name): an alias left by an
        # earlier trace may name a module since imported afresh, whose values the model no longer reads
        if isinstance(value, types.ModuleType) and live_globals.get(name) is not value:
            live_globals[name] = value
    builtins_name = getattr(graph, "name_of_builtins_dict_key_in_fglobals", None)
    if builtins_name and builtins_name not in live_globals:
        live_globals[builtins_name] = get_builtins_dict(live_globals)
        _reserve_dynamo_name(builtins_name)


def _reserve_dynamo_name(name: str) -> None:
    """Keep this process's later traces from drawing ``name`` again. Dynamo names the globals it installs with
    a per-process counter (``__builtins_dict___2``) and refuses to install a name the module already has
    (``CleanupHook``: "Name ... already exists in scope"): the build's name, installed here, would make the
    trace of a process that compiles after loading a package fail when its counter reaches the same number
    (a process that loaded a learned shape's package, then built its own). So the counter is moved past it."""
    from torch._dynamo import bytecode_transformation

    number = name.rpartition("_")[2]
    counter = getattr(bytecode_transformation, "_unique_id_counter", None)
    if not number.isdigit() or counter is None:
        return
    while next(counter) <= int(number):
        pass


def _compare(guards: Any, described: Mapping[str, Optional[str]], live_locals: dict, live_globals: dict) -> None:
    """Every guard on the model or the globals: the live value, described portably, is the build's."""
    from torch._dynamo.guards import _get_closure_vars

    scope = {"L": live_locals, "G": live_globals, "__builtins__": builtins.__dict__}
    closure_vars = _get_closure_vars()
    cache: Dict[Any, Any] = {}
    roots: Dict[int, Optional[str]] = {}
    for guard in guards:
        kind = guard.create_fn_name()
        if kind in GLOBAL_KINDS or kind == HOOK_KIND or root(guard.originating_source, roots) in CALL_LOCALS:
            continue  # the hook dicts: Hooks.add checks each is here and empty
        filed = key(guard)
        if filed not in described:
            raise NoProof(f"the proof does not describe {kind} on {guard.name}")
        want = described[filed]
        try:
            value = guard.originating_source.get_value(scope, closure_vars, cache)
        except Exception:  # noqa: BLE001 - the source does not exist here
            if want is None:
                continue
            raise NoProof(f"{guard.name} is not there in this process (the build read it)") from None
        got = portable.describe(kind, value)
        if got != want:
            raise NoProof(f"{guard.name} is not what the package was built with ({kind}: "
                          f"built {short(want)}, here {short(got)})")
    for filed, want in described.items():
        if not filed.startswith(INPUT):
            continue
        name = filed[len(INPUT):]
        try:
            got = portable.graph_input(eval(templates.compiled(name), dict(scope), closure_vars))  # noqa: S307 - Dynamo's own source text
        except Exception:  # noqa: BLE001
            got = None
        if got is None or got != want:
            raise NoProof(f"{name}, which the package holds as a constant, is not the value it was built with")



def _check_sources(sources: List[Any]) -> None:
    for module_name, first, last, digest in sources:
        module = sys.modules.get(module_name)
        if module is None:
            try:
                module = importlib.import_module(module_name)
            except Exception as exc:  # noqa: BLE001
                raise NoProof(f"{module_name}, which the build traced, does not import here: "
                              f"{first_line(exc)}") from exc
        filename = getattr(module, "__file__", None) or ""
        lines = linecache.getlines(filename, module.__dict__)[first - 1:last - 1]
        if lines_digest(lines) != digest:
            raise NoProof(f"{module_name} lines {first}-{last - 1} are not the ones the package was built from")
