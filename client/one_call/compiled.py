"""``CompiledModel``: what ``compile()`` returns; a hit's runner, else torch.compile, and the publish after a miss.

A hit: the package runs each call that matches its spec, on the model's tensors as they are
(binding.py: a replaced parameter is rebound, or the call goes to torch.compile); with
``verify=True`` its first output is compared with eager's first. Once the first call has its output,
the key's snapshot is restored in the background, so a call off the spec (another batch size)
compiles from Inductor's cache. A miss: the snapshot is restored, torch.compile serves, and the
publish starts after the first call (publisher.py). Every fall-back to torch.compile is logged once per cause, and ``calls.why``
and the restore report's ``warnings`` say why.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from . import calls, learned as learned_mod, publisher as publisher_mod, shapes as shapes_mod, spec as spec_mod
from . import deferred, support, verify as verify_mod, warmup
from .slot import Slot, open_slot
from .. import usage
from ..errors import HitRequired

log = logging.getLogger("cachesvc_client")
#: how long a call that goes to torch.compile on a hit waits for the background snapshot restore
SNAPSHOT_WAIT_S = 60.0


class Calls(dict):
    """``{"artifact": n, "torch.compile": m}``: the calls each served; ``why``: the cause of the first
    fall-back to torch.compile ("" while none), ``causes``: every distinct one, in order."""

    def __init__(self) -> None:
        super().__init__({"artifact": 0, "torch.compile": 0})
        self.why, self.causes = "", []


class CompiledModel:
    """What ``compile()`` returns. ``route``: aoti | torch; ``source``: artifact (a hit) | compiled."""

    def __init__(self, model: Any, args: tuple, call_kwargs: Dict[str, Any], *, name: str, mode: Optional[str],
                 client: Any, tags: Optional[Mapping[str, str]], publish: Optional[bool],
                 torch_compile_kwargs: Dict[str, Any], verify: bool = False, require_hit: Optional[bool] = None,
                 declared: Optional[Dict[str, Any]] = None):
        import torch

        from ..client import CacheClient

        started = time.monotonic()
        self.model, self.args, self.call_kwargs, self.name, self.mode = model, args, call_kwargs, name, mode
        self.kwargs = torch_compile_kwargs
        self.client = client if client is not None else CacheClient()
        #: the example call's tensors, in the package's order (calls.leaves: positional, then keywords by name)
        self.example_inputs = tuple(calls.leaves(args, call_kwargs)[0])
        first = self.example_inputs[0] if self.example_inputs else None
        self.device = str(first.device) if isinstance(first, torch.Tensor) else "cpu"
        self.route, self.route_reason = support.choose_route(self.example_inputs, torch_compile_kwargs)
        # what the package serves (only tensors can be declared: another route needs no spec)
        self.spec = calls.CallSpec(args, call_kwargs, bool(model.training), forward=getattr(model, "forward", None),
                                   **(declared or {})) if self.route == "aoti" else None
        base = shapes_mod.signature(args, call_kwargs)
        self.shape = self.spec.signature(base) if self.spec is not None else base
        #: reduce-overhead on a GPU: a hit replays the package's run from a CUDA graph (graph.py)
        self.cuda_graph = support.wants_cuda_graph(mode, self.device)
        self.tags = spec_mod.key_tags(model, tags, mode, self.route, torch_compile_kwargs)
        #: where compile()'s own seconds went: "key" (the spec and the key's code and config walk), "restore"
        #: (resolve and fetch), on a hit "proof", "bind", "load" (slot.py), on a miss "snapshot", "background"
        #: (starting usage; a miss's learned packages), "total"; after a hit's first call "first_check" and
        #: "first_run" (that call's), "deferred" (starting its snapshot restore and learned packages, deferred.py);
        #: "gc" (compile(): the collector's seconds inside the others, process/collector.py); also in the report
        self.phases: Dict[str, float] = {"key": round(time.monotonic() - started, 4)}
        self.source, self.miss_reason, self.report = "compiled", "", None
        self.load_seconds, self.verify_seconds = 0.0, None
        #: a hit's proof: how long comparing it and rebuilding its guard trees took, and how many guards
        self.proof_seconds, self.proof_guards = None, 0
        #: a hit's first torch.compile call: how long it waited for the background snapshot restore
        self.snapshot_wait_seconds: Optional[float] = None
        self.require_hit = support.require_hit(require_hit)
        self._verify = verify
        #: the example's package, opened (slot.py: its runner, live tensors and proof, checked before every call)
        self._slot: Optional[Slot] = None
        self._snapshot_future: Any = None
        self._compiled: Any = None
        #: calls served by the precompiled artifact / by torch.compile, and why torch.compile served
        self.calls = Calls()
        self._publish = bool(self.client.token) if publish is None else publish
        self._publish_asked = publish is True  # a build job's: it tries a package again whatever failed before
        self._publisher: Optional[publisher_mod.Publisher] = None
        self._lock = threading.Lock()
        self._background_lock = threading.Lock()
        self._warming = False  # warm_up's calls are not the fleet's: usage does not count them
        self.warmed = None  # what ``warm_up`` ran
        self._start(started)

    def _start(self, started: float) -> None:
        """The package if one serves, else the snapshot for torch.compile; then what runs beside the calls."""
        if self.route == "aoti":
            self._try_artifact()
        else:
            self.miss_reason = f"route torch: {self.route_reason}"
        if self._slot is None:
            self._restore_snapshot()
            self._timed("snapshot", started)  # a miss: torch.compile's caches, before its first call
            self._fell_back(self._miss_cause(), declared=True)
        #: the calls of each input shape and how each was served, reported to the service (cachesvc_client.usage);
        #: not where the restore found the service down: its exit would wait for it again
        down = any(r is not None and r.service_down for r in (self.report, getattr(self, "snapshot", None)))
        self._tally = None if down else usage.track(self.client, self.name, self.tags)
        #: the packages of the other shapes the fleet served, fetched in the background (learned.py); a miss that
        #: publishes fetches them after its publish traced the model (a proof's load writes the globals it reads)
        self._down = down
        self._learned = None
        #: a hit's background work (the snapshot restore, the learned packages) starts once the first call has its
        #: output, or at the first call the package does not serve, or at warm_up(): started here it shared the
        #: GIL with the package's first run, the part of the first output the one call changes
        self._deferred = self._slot is not None
        self._deferred_thread: Optional[threading.Thread] = None  # the first output's start of it (deferred.py)
        self.gc_hold: Any = None  # compile()'s hold on the full collections, on a hit until just after its first output
        if self._slot is None and not (down or self._publish):
            self._learned = learned_mod.start(self)
        self._timed("background", started)
        self.phases["total"] = round(time.monotonic() - started, 4)
        if self.report is not None:
            self.report.phases = self.phases

    def _timed(self, phase: str, started: float) -> None:
        """``phases[phase]``: the seconds since ``started`` less the phases timed before it."""
        spent = sum(v for k, v in self.phases.items() if k != "total")
        self.phases[phase] = round(max(0.0, time.monotonic() - started - spent), 4)

    # -- a hit -------------------------------------------------------------------------------------

    def _try_artifact(self) -> None:
        started = time.monotonic()
        report = self.client.restore(self.name, self.shape, self.tags, kind=support.KIND, require_hit=False)
        self.report = report
        self.phases["restore"] = round(time.monotonic() - started, 4)
        if not report.hit:
            self.miss_reason = report.reason or "no published artifact for this key"
            return
        slot, why = open_slot(self.shape, report, self.model, self.spec, self.device, self.cuda_graph)
        if slot is None:
            self.miss_reason = f"not using the published artifact: {why}"
            return
        self._slot = slot
        self.phases.update(slot.phases)
        self.proof_seconds, self.proof_guards = slot.proof.load_seconds, slot.proof.guards
        self.source, self.load_seconds = "artifact", time.monotonic() - started
        log.info("cachesvc compile %s: loaded the precompiled artifact (version %s) in %.2f s (%s)",
                 self.name, report.version_id, self.load_seconds,
                 ", ".join(f"{k} {v:.2f} s" for k, v in self.phases.items()))

    def _restore_snapshot(self) -> None:
        """A miss: bring back the key's snapshot (a previous publish's kernels) so torch.compile hits it.
        Not when the artifact's restore found the service down: a second try would cost the process
        the same wait (a refused connection's seconds, a stalled service's deadline) and log it again."""
        if self.report is not None and self.report.service_down:
            self.snapshot = self.report
            return
        self.snapshot = self.client.restore(self.name, self.shape, self.tags, require_hit=False)

    def _miss_cause(self) -> str:
        """Why there is no package: the miss's reason, and what the process that compiled this key said
        when its package failed, so a restarted process names the builder's cause (which node, why) rather
        than only "no package"."""
        cause = self.miss_reason or "no published artifact for this key"
        built = support.package_failed(getattr(self, "snapshot", None))
        return f"{cause}; the process that compiled it published no package: {built}" if built else cause

    def _start_deferred(self) -> None:
        """The background work now (deferred.py), the hold on the full collections ended first."""
        deferred.start(self)

    def _start_snapshot_restore(self) -> None:
        """A hit: restore the key's snapshot in the background, so a call off the spec (another batch
        size) compiles from Inductor's cache, not cold. Never on the hit's path: a failure only logs."""
        self.snapshot = None
        try:
            self._snapshot_future = self.client.start_restore(self.name, self.shape, self.tags, require_hit=False)
        except Exception as exc:  # noqa: BLE001 - the hit is served either way
            log.warning("cachesvc compile %s: the background snapshot restore did not start: %s", self.name, exc)

    def _await_snapshot(self, timeout: float = SNAPSHOT_WAIT_S) -> None:
        self._start_deferred()  # torch.compile before the first served call returned (verify found a difference)
        future, self._snapshot_future = self._snapshot_future, None
        if future is None:
            return
        started = time.monotonic()
        try:
            self.snapshot = future.result(timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - a late or failed restore: torch.compile compiles cold
            log.warning("cachesvc compile %s: the background snapshot restore did not finish: %s", self.name, exc)
        self.snapshot_wait_seconds = time.monotonic() - started

    # -- calls -------------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        slot = self._slot
        if slot is not None:
            checking = time.monotonic() if slot.calls == 0 else 0.0
            why, declared, flat = slot.refusal(args, kwargs, self.model, self.name)
            if why is None:
                self.calls["artifact"] += 1
                slot.calls += 1
                if self._tally is not None and not self._warming:  # one shape: one token; ranges: the shapes
                    token = tuple(t.shape for t in flat) if self.spec.dynamic else ()
                    self._tally.count(token, 0, lambda: shapes_mod.signature(args, kwargs))
                if slot.calls > 1:
                    return slot.runner(*flat)
                waiting = time.monotonic()
                slot.libraries.wait()  # readied beside the proof (libraries.py); a capture must not share the GPU
                started = time.monotonic()
                out = self._first_checked(slot.runner, flat, args, kwargs) if self._verify else slot.runner(*flat)
                # the first served call's own seconds: its checks (proof, binding, spec), the wait for the libraries'
                # thread, then the run as the CPU saw it (launches, the kernels' first loads; the device may still
                # be running it); "libraries": how long that thread ran, beside compile()
                self.phases.update(first_check=round(waiting - checking, 4), libraries_wait=round(started - waiting, 4),
                                   first_run=round(time.monotonic() - started, 4))
                if slot.libraries.seconds is not None:
                    self.phases["libraries"] = slot.libraries.seconds
                report = self._hit_reporter(self.load_seconds + time.monotonic() - started) if self._slot else None
                deferred.after_first_output(self, report)  # in a thread, after a pause: this call returns now
                return out
            if slot.dead:
                self._slot = None
        self._start_deferred()
        learned = self._learned.find(args, kwargs) if self._learned is not None else None
        if learned is not None:
            return self._serve_learned(*learned, args, kwargs)
        if slot is not None:
            self._fell_back(why, declared=declared)
        first = self._compiled is None
        self.calls["torch.compile"] += 1
        if self._tally is not None and not self._warming:
            shape = shapes_mod.signature(args, kwargs)
            self._tally.count(shape, 1, lambda: shape)
        out = self._torch_compiled()(*args, **kwargs)
        if first and self._slot is None and self._publish:
            self._start_publish()
        return out

    def _serve_learned(self, slot: Slot, flat: List[Any], args: tuple, kwargs: dict) -> Any:
        """A call served by a learned shape's package (learned.py)."""
        self.calls["artifact"] += 1
        slot.calls += 1
        if self._tally is not None and not self._warming:
            self._tally.count(("learned",) + tuple(t.shape for t in flat), 0, lambda: shapes_mod.signature(args, kwargs))
        if slot.calls == 1:
            slot.libraries.wait()
        return slot.runner(*flat)

    def _first_checked(self, runner: Any, flat: list, args: tuple, kwargs: dict) -> Any:
        """verify=True: the first call runs the package (on ``flat``, the call's tensors) and eager and
        compares them (verify.close; a bf16/fp16 model also runs a float32 copy of itself once, the measure
        of eager's own rounding); a difference sends this call and every later one to torch.compile."""
        self._verify = False
        started = time.monotonic()
        got = runner(*flat)
        wide = verify_mod.float32_reference(self.model, [(args, kwargs)])  # bf16/fp16: eager's own rounding
        why = verify_mod.differs(got, self.model(*args, **kwargs), self.device, wide[0] if wide else None)
        self.verify_seconds = time.monotonic() - started
        if why is None:
            return got
        self._slot = None
        self.calls["artifact"] -= 1
        self._fell_back(f"the package's first output differs from eager's: {why}", declared=True)
        self.calls["torch.compile"] += 1
        return self._torch_compiled()(*args, **kwargs)

    def _hit_reporter(self, first_call_seconds: float) -> Callable[[], None]:
        """The package served the first call: what tells the service, as ``client.verify()`` does after a
        snapshot restore, so its stats and pages count the hit and the compile seconds it saved (the package's
        build minus this first call). Sent by the first output's background thread (deferred.py), also as the
        process exits; a failure only logs."""
        versions, spent = [self.report.version_id], round(first_call_seconds, 3)

        def send() -> None:
            try:
                self.client.report_verdict(versions, "paid_off", first_call_seconds=spent)
            except Exception as exc:  # noqa: BLE001 - statistics: never the serving process's trouble
                log.info("cachesvc compile %s: could not report the hit: %s", self.name, exc)

        return send

    def _torch_compiled(self) -> Any:
        if self._compiled is None:
            self._await_snapshot()
            with self._lock:
                if self._compiled is None:
                    import torch

                    self._compiled = torch.compile(self.model, mode=self.mode, **self.kwargs)
        return self._compiled

    def warm_up(self, shapes: Optional[Sequence[str]] = None, *, timeout: float = 600.0) -> Dict[str, Any]:
        """Run each shape the fleet served once, on inputs made from the example call, before traffic
        (warmup.py). Returns, and keeps in ``warmed`` and the restore report's ``warmed``,
        ``{"shapes": {shape: {"served": "package" | "compile" | "skipped", "seconds"}}, "seconds", "packages",
        "compiled", "background_s"}`` (``background_s``: the wait for the background snapshot restore, so
        nothing compile() started still runs beside the first requests); no shape starts after ``timeout`` s.
        Call it as the model is served (under ``torch.no_grad()`` where that is how); its calls are not
        counted as the fleet's usage."""
        self._start_deferred()
        self._warming = True
        started = time.monotonic()
        try:
            self.warmed = warmup.warm_up(self, self._learned, shapes, timeout)
        finally:
            self._warming = False
        # What compile() started beside the calls ends before traffic too: the background snapshot restore
        # (fetch, decompress, write) shares the serving thread's GIL, and after a warm-up it put 2-16 ms on
        # requests of 0.2 ms for the first few hundred (bench/serving_replay.py on a 2-core CPU, 2026-12-05).
        waited = time.monotonic()
        self._await_snapshot(max(0.0, timeout - (waited - started)))
        self.warmed["background_s"] = round(time.monotonic() - waited, 3)
        if self.report is not None:
            self.report.warmed = self.warmed
        return self.warmed

    @property
    def learned(self) -> Dict[str, Any]:
        """The learned shapes' packages: served (shape, calls), skipped (shape: why), seconds, done."""
        if self._learned:
            return self._learned.info()
        return {"packages": [], "skipped": {}, "seconds": None, "done": not self._deferred}

    @property
    def usage(self) -> Dict[str, Dict[str, int]]:
        """``{shape: {"package": n, "compile": n, "eager": n}}``: this process's calls, as reported (usage/)."""
        return self._tally.totals() if self._tally is not None else {}

    @property
    def capture_seconds(self) -> Optional[float]:
        """How long the hit's CUDA-graph capture took (reduce-overhead on a GPU), once it ran; else None."""
        return self._slot.runner.capture_seconds if self._slot is not None else None

    @property
    def capture_phases(self) -> Dict[str, float]:
        """Where the first capture's seconds went (graph.GraphedRun.phases); empty before one ran."""
        return dict(self._slot.runner.capture_phases) if self._slot is not None else {}

    @property
    def proof_phases(self) -> Dict[str, float]:
        """Where the hit's proof's seconds went (proof.Proof.phases, Dynamo's imports included); {} on a miss."""
        return {k: round(v, 4) for k, v in self._slot.proof.phases.items()} if self._slot is not None else {}

    def _fell_back(self, why: str, *, declared: bool) -> None:
        """One line per cause; ``declared``: on the inputs the key was built for (require_hit refuses those)."""
        if self.require_hit and declared:
            raise HitRequired(f"cachesvc compile {self.name}: a hit is required ({support.REQUIRE_HIT_VAR} "
                              f"or require_hit=True) and torch.compile would serve it: {why}", report=self.report)
        if why in self.calls.causes:
            return
        self.calls.causes.append(why)
        self.calls.why = self.calls.why or why
        if self.report is not None:
            self.report.warnings.append(f"torch.compile serves: {why}")
        log.warning("cachesvc compile %s: torch.compile serves this %s: %s", self.name,
                    "model" if self._slot is None else "call", why)

    # -- publish after a miss ----------------------------------------------------------------------

    def _start_publish(self) -> None:
        try:
            key = self.client.key(self.name, self.shape, self.tags)
        except Exception as exc:  # noqa: BLE001 - e.g. a bad env file: the call's result is still good
            log.warning("cachesvc compile %s: not publishing: %s", self.name, exc)
            return
        known = "" if self._publish_asked else support.package_failed(getattr(self, "snapshot", None))
        if known:
            log.info("cachesvc compile %s: not building a package: the process that compiled this key could not (%s); "
                     "a build with other code or another torch, or compile(publish=True), tries again", self.name, known)
        self._publisher = publisher_mod.Publisher(self, key, known_failure=known)
        # the export here, in the thread that made the first call, not in the background beside later calls
        self._publisher.export()
        self._publisher.start()
        if self._learned is None and not self._down:
            self._learned = learned_mod.start(self)

    def wait_published(self, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """Wait for the background publish; return {"snapshot": report dict, "artifact": report dict or error}.

        None when nothing is being published (a hit, no write token, or before the first call).
        A process that exits without waiting has the publish finished at exit, up to a deadline
        (publisher.py: ``CACHESVC_PUBLISH_AT_EXIT_S``); a short-lived job should wait here.
        """
        return self._publisher.wait(timeout) if self._publisher is not None else None

    def __getattr__(self, attr: str) -> Any:  # model attributes, as torch.compile's OptimizedModule offers
        if attr == "model":
            raise AttributeError(attr)
        return getattr(self.model, attr)
