"""The packages of the shapes the fleet learned: found, fetched and opened in the background.

Besides the example's package, a key family (the model's name, tags and environment) may hold packages
of other shapes: built by a build job for what the fleet served (``cachesvc-client build``), or published
by a process that compiled another example. At start the one call lists them (``CacheClient.packages``),
reads the fleet's demand (``CacheClient.demand``) to fetch the busiest first, and opens each in a
background thread (slot.py: the same checks as the example's, its own proof and runner). A call the
example's package does not serve goes to the first learned package that serves it; a call whose package
is still being fetched waits for it (a fetch is seconds, a compile more), and a call no package serves
goes to torch.compile as before.

A package's key names the shape it serves (``f32[4,256]``) or its declared ranges
(``f32[4,256]|dynamic=(batch:1..8,256)``): a call of that shape is made from the example call
(shapes.py), a spec from it and the declaration (calls.CallSpec), and a key that does not parse back
to the same text is skipped (the listing is the service's answer: untrusted).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from . import calls, shapes, support
from .slot import Slot, open_slot
from .. import settings
from ..process.exits import at_exit

log = logging.getLogger("cachesvc_client")

#: learned shapes' packages fetched by default (CACHESVC_LEARNED_PACKAGES)
LEARNED_PACKAGES = 16


def start(compiled: Any) -> Optional["Learned"]:
    """``compiled``'s key family's packages of other shapes, fetched in the background; None off the package
    route, with ``CACHESVC_LEARNED_PACKAGES=0``, or without a service."""
    limit = learned_limit()
    if compiled.route != "aoti" or limit == 0 or not getattr(compiled.client, "url", ""):
        return None
    learned = Learned(compiled, limit)
    learned.start()
    return learned


def learned_limit() -> int:
    """How many learned packages a process fetches: CACHESVC_LEARNED_PACKAGES, else ``LEARNED_PACKAGES``."""
    given = settings.current().learned_packages
    try:
        return max(0, int(given)) if given is not None else LEARNED_PACKAGES
    except ValueError:
        log.warning("cachesvc compile: %s=%r is not a whole number; fetching up to %d learned packages",
                    settings.LEARNED_PACKAGES_VAR, given, LEARNED_PACKAGES)
        return LEARNED_PACKAGES

#: how long a call waits for the listing (one small GET), and for its shape's package to be fetched
LIST_WAIT_S = 10.0
LOAD_WAIT_S = 60.0
#: calls' shape tokens remembered with the learned package that served them (dispatch without a walk)
ROUTES_KEPT = 1024
#: how long an exiting process waits for the package being opened. The interpreter must not finalize while
#: the background thread is inside AOTInductor's loader: that aborted a fleet process after its last output
#: ("terminate called without an active exception", exit -6; CI, 2026-12-05). A package opens in seconds.
AT_EXIT_S = 30.0


class Learned:
    """The learned packages of one CompiledModel (``compiled``), fetched at most ``limit`` at a time."""

    def __init__(self, compiled: Any, limit: int):
        self.compiled, self.limit = compiled, limit
        self.slots: List[Slot] = []
        #: the demand read at start, busiest first (what ``warm_up`` runs); [] when none could be read
        self.demand: List[Dict[str, Any]] = []
        #: key shape -> why its package is not served here
        self.skipped: Dict[str, str] = {}
        self.seconds: Optional[float] = None
        self._pending: List[Tuple[str, calls.CallSpec, threading.Event]] = []
        #: a call's shape token (route_token) -> the slot that served it last: checked first, alone
        self._routes: Dict[tuple, Slot] = {}
        self._listed, self._done, self._stopping = threading.Event(), threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"cachesvc-learned-{compiled.name}", daemon=True)

    def start(self) -> None:
        # the exit's wait first: a thread started once the interpreter is exiting (a hit's background start,
        # which the exit lets finish) would be inside AOTInductor's loader when it finalizes (exit -6: CI,
        # 2026-12-06); such a process opens nothing, and no call waits for the listing
        if not at_exit(self._stop_at_exit):
            self._listed.set()
            self._done.set()
            return
        self._thread.start()

    def _stop_at_exit(self) -> None:
        """At interpreter exit: open no more packages, and let the one being opened finish (a short-lived
        process's exit is not a fault: said at debug level only)."""
        self._stopping.set()
        if not self._thread.is_alive():
            return
        self._thread.join(AT_EXIT_S)
        log.debug("cachesvc compile %s: the process exited while learned packages were being opened; %s",
                  self.compiled.name, "still opening one" if self._thread.is_alive() else "stopped")

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until every listed package was fetched and opened (or skipped); False on timeout."""
        return self._done.wait(timeout)

    def find(self, args: tuple, kwargs: dict) -> Optional[Tuple[Slot, List[Any]]]:
        """The learned package that serves this call and the call's tensors, or None."""
        c = self.compiled
        if not self._listed.is_set() and not self._listed.wait(LIST_WAIT_S):
            return None
        served = self._serving(args, kwargs)
        if served is None:
            for shape, spec, loaded in list(self._pending):
                if not loaded.is_set() and spec.mismatch(args, kwargs, c.model) is None:
                    loaded.wait(LOAD_WAIT_S)  # its package is on its way: seconds, where a compile costs more
                    served = self._serving(args, kwargs)
                    break
        return served

    def info(self) -> Dict[str, Any]:
        """What was found: the packages served (shape, calls) and the ones skipped, and why."""
        with self._lock:
            slots = list(self.slots)
        return {"packages": [{"shape": s.shape, "calls": s.calls} for s in slots], "skipped": dict(self.skipped),
                "seconds": self.seconds, "done": self._done.is_set()}

    def _serving(self, args: tuple, kwargs: dict) -> Optional[Tuple[Slot, List[Any]]]:
        """The first package that serves the call. A call shaped like an earlier one tries that one's
        package first, alone: the walk checks every package's spec in turn, and a shape late in the list
        paid tens of microseconds a call for it (the H200 replay's tail). The remembered package still
        runs every check; one that refuses sends the call on the walk."""
        token = route_token(args, kwargs)
        known = self._routes.get(token) if token is not None else None
        if known is not None:
            served = self._refused_or_served(known, args, kwargs)
            if served is not None:
                return served
        with self._lock:
            slots = list(self.slots)
        for slot in slots:
            if slot is known:
                continue
            served = self._refused_or_served(slot, args, kwargs)
            if served is not None:
                if token is not None:
                    if len(self._routes) >= ROUTES_KEPT:
                        self._routes.clear()
                    self._routes[token] = slot
                return served
        return None

    def _refused_or_served(self, slot: Slot, args: tuple, kwargs: dict) -> Optional[Tuple[Slot, List[Any]]]:
        why, _, flat = slot.refusal(args, kwargs, self.compiled.model, self.compiled.name)
        if why is None:
            return slot, flat
        if slot.dead:
            with self._lock:
                self.slots = [s for s in self.slots if s is not slot]
            self._routes = {t: s for t, s in self._routes.items() if s is not slot}
        return None

    # -- the background thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        started = time.monotonic()
        try:
            self._list()
        except Exception as exc:  # noqa: BLE001 - learned shapes are a bonus: torch.compile serves without them
            log.info("cachesvc compile %s: no learned shapes: %s", self.compiled.name, getattr(exc, "message", exc))
        finally:
            self._listed.set()
        try:
            for shape, spec, loaded in self._pending:
                try:
                    if self._stopping.is_set():
                        self.skipped[shape] = "the process exited first"
                    else:
                        self._open(shape, spec)
                finally:
                    loaded.set()
        finally:
            self.seconds = time.monotonic() - started
            self._done.set()
        if self.slots:
            log.info("cachesvc compile %s: %d learned shape package(s) ready in %.2f s", self.compiled.name,
                     len(self.slots), self.seconds)

    def _list(self) -> None:
        c = self.compiled
        listed = [s for s in c.client.packages(c.name, c.tags) if s != c.shape]
        if not listed:
            return
        try:
            self.demand = c.client.demand(c.name, c.tags)
        except Exception as exc:  # noqa: BLE001 - without demand the packages still serve, most restored first
            log.info("cachesvc compile %s: the fleet's demand could not be read: %s", c.name,
                     getattr(exc, "message", exc))
        pending = []
        for shape in listed:
            spec, why = self._spec(shape)
            if spec is None:
                self.skipped[shape] = why
            else:
                pending.append((shape, spec, threading.Event()))
        pending.sort(key=lambda item: -self._busy(item[1]))
        for shape, _, _ in pending[self.limit:]:
            self.skipped[shape] = f"more than {self.limit} learned packages (CACHESVC_LEARNED_PACKAGES)"
        self._pending = pending[:self.limit]

    def _spec(self, shape: str) -> Tuple[Optional[calls.CallSpec], str]:
        """What the package keyed ``shape`` serves, made from the example call; (None, why) where it cannot be."""
        c = self.compiled
        base, _, declared = shape.partition("|")
        call = shapes.resized(c.args, c.call_kwargs, base)
        if call is None:
            return None, "not a shape of this model's call"
        dims = None
        if declared.startswith("dynamic="):
            dims = calls.parse_declared(declared[len("dynamic="):])
            if dims is None:
                return None, "its declared ranges do not parse"
        elif declared:
            return None, "declared examples are served by the process that declares them"
        try:
            spec = calls.CallSpec(call[0], call[1], bool(c.model.training), forward=getattr(c.model, "forward", None),
                                  leaf_dims=dims)
        except ValueError as exc:
            return None, str(exc)
        if spec.signature(base) != shape:
            return None, "its key does not parse back to itself"
        if not _covers(spec, base):  # a builder's example lies within what it declared
            return None, "its declared ranges do not hold its own shape"
        return spec, ""

    def _busy(self, spec: calls.CallSpec) -> int:
        """The fleet's calls this package would serve, by the demand read at start (by shapes alone)."""
        return sum(row["calls"] for row in self.demand if _covers(spec, row["shape"]))

    def _open(self, shape: str, spec: calls.CallSpec) -> None:
        c = self.compiled
        report = c.client.restore(c.name, shape, c.tags, kind=support.KIND, require_hit=False)
        if not report.hit:
            self.skipped[shape] = report.reason or "no package"
            return
        if self._stopping.is_set():  # fetched as the process exits: not opened, as a load must not be cut short
            self.skipped[shape] = "the process exited first"
            return
        slot, why = open_slot(shape, report, c.model, spec, c.device, c.cuda_graph)
        if slot is None:
            self.skipped[shape] = why
            log.info("cachesvc compile %s: not serving the learned shape %s: %s", c.name, shape, why)
            return
        with self._lock:
            self.slots.append(slot)


def route_token(args: tuple, kwargs: dict) -> Optional[tuple]:
    """The shapes of a call's top-level tensors (and other arguments' types): which package served a call
    like it decides which is asked first. None where a nested argument hides tensors (the walk decides)."""
    token = []
    for value in (*args, *kwargs.values()):
        shape = getattr(value, "shape", None)
        if shape is None and isinstance(value, (list, tuple, dict)):
            return None
        token.append(shape if shape is not None else type(value))
    return (*token, *kwargs) if kwargs else tuple(token)


def _covers(spec: calls.CallSpec, shape: str) -> bool:
    """Whether the shape text's tensor sizes fit the spec's (declared ranges, one size per name)."""
    wanted = [dims for _, dtype, dims in (shapes.items(shape) or []) if dtype is not None]
    if len(wanted) != len(spec.tensors):
        return False
    sizes: Dict[str, int] = {}
    for dims, tensor in zip(wanted, spec.tensors):
        if len(dims) != len(tensor.shape):
            return False
        for got, want in zip(dims, tensor.shape):
            if isinstance(want, int):
                if got != want:
                    return False
            elif not want[1] <= got <= want[2] or sizes.setdefault(want[0], got) != got:
                return False
    return True
