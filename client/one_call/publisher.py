"""After a miss's first call: publish the snapshot and build, check and publish the precompiled artifact.

The model is exported in the thread that made the first call, right after it
(export.py says why not in the background); the rest runs in one
background thread so the process keeps serving: the snapshot is published,
the package is built from the exported program in a child process (no
Inductor config patches, fx state or GIL held in this one), then run the way
a hit runs it, in another fresh child process (verify.py), and
compared with eager on the example inputs: a package that does not
reproduce the model, or whose loader crashes, is never published.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

from . import build, computed, ends, export, proof, support, verify
from .. import onefile, settings
from ..settings import PUBLISH_AT_EXIT_VAR as AT_EXIT_VAR
from ..errors import CacheClientError
from ..process.exits import at_exit  # noqa: F401 - compiled.py registers its hit's report through it

log = logging.getLogger("cachesvc_client")


class Publisher:
    def __init__(self, compiled: Any, key: dict, *, known_failure: str = ""):
        """``known_failure``: why the process that compiled this key before could build no package (its
        snapshot's meta): no package is tried again here (``export`` returns at once), the snapshot carries
        the cause on, and a build with other code or another torch (another key) tries afresh."""
        self.compiled, self.key = compiled, key
        self.result: Dict[str, Any] = {}
        self._known_failure = known_failure
        self.exported = ""  # how torch.export made the program: non-strict, or strict where that failed (+ lowered)
        self._thread = threading.Thread(target=self._run, name=f"cachesvc-compile-publish-{key['name']}",
                                        daemon=True)
        self._work: Optional[str] = None  # the exported program's folder, removed when the thread ends
        self._not_exported = ""
        self._imports: List[str] = []  # the modules of the program's pytree types (export.py)
        self._bound: List[str] = []  # the plain tensor attributes the program reads as buffers (export.py)
        self._proof: Optional[proof.Built] = None  # the trace's guards, shipped in the package (proof/)
        self._ends: List[ends.End] = []  # the declared ranges' ends the publish check adds (ends.py)

    def export(self) -> None:
        """Trace the model's guards and export it for the package (the aoti route), in the caller's
        thread and grad/autocast state. Never raises: a failure is the artifact's error."""
        c = self.compiled
        if c.route != "aoti" or support.support():
            return
        if self._known_failure:  # the same key failed before: not again in this serving thread
            self._not_exported = self._known_failure
            return
        self._work = tempfile.mkdtemp(prefix="cachesvc-compile-")
        try:
            self._proof = proof.capture(c.model, c.args, c.call_kwargs, dynamic=c.spec.dynamic_leaves())
        except proof.NoProof as exc:  # a package nothing can vouch for would never serve: none is built
            self._not_exported = f"no proof the package computes this model: {exc.message}"
            return
        try:
            self._export()
        except Exception as exc:  # noqa: BLE001 - torch.export refuses many models; the call's result is good
            self._not_exported = f"torch.export failed: {export.why_failed(exc)}"
            return
        try:
            self._proof, self._ends = ends.plan(c, self._proof)  # the ranges as exported
        except proof.NoProof as exc:
            self._not_exported = f"no proof the package computes this model: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - never the serving call's trouble: no package, and why
            self._not_exported = f"the declared range's ends could not be planned: {_why(exc)}"

    def _export(self) -> None:
        c = self.compiled
        with proof.environment_reads(self._proof) as names:
            made = export.export(c.model, c.args, os.path.join(self._work, "exported.pt2"), kwargs=c.call_kwargs,
                                 dynamic_shapes=c.spec.export_dynamic_shapes(c.model.forward, c.args, c.call_kwargs),
                                 attributes=self._proof.attributes)
            if made.how == "strict":  # Dynamo traced symbolically: the model's Python ran for real once
                export.run_once(c.model, c.args, c.call_kwargs)
        self._proof = self._proof.with_environment(names)
        self._imports = made.imports
        self._bound = made.attributes
        self.exported = f"{made.how}, lowered to ATen" if made.decomposed else made.how
        if made.narrowed:
            before = c.spec.served_text()
            c.spec.narrow(made.narrowed)
            log.warning("cachesvc compile %s: declared %s is served as %s (torch.export's suggested fix: %s); calls "
                        "outside it run torch.compile", c.name, before, c.spec.served_text(), made.fix)

    def start(self) -> None:
        self._thread.start()
        at_exit(self.finish_at_exit)

    def finish_at_exit(self) -> None:
        """At interpreter exit, before Python's thread pools refuse new work: wait for the publish, up to
        ``$CACHESVC_PUBLISH_AT_EXIT_S`` seconds (default ``AT_EXIT_S``; 0: not at all), and log how it went."""
        if not self._thread.is_alive():
            return
        deadline = _at_exit_seconds()
        name = self.compiled.name
        log.warning("cachesvc compile %s: the process is exiting before its publish finished; waiting up to "
                    "%.0f s for it (%s; call wait_published() before exiting to choose)", name, deadline, AT_EXIT_VAR)
        started = time.monotonic()
        self._thread.join(deadline)
        if self._thread.is_alive():
            log.warning("cachesvc compile %s: gave up on the publish at exit after %.1f s: it is lost; the next miss "
                        "publishes again", name, time.monotonic() - started)
        else:
            log.warning("cachesvc compile %s: the publish finished at exit in %.1f s", name, time.monotonic() - started)
        self.result["at_exit_s"] = time.monotonic() - started

    def wait(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        self._thread.join(timeout)
        return dict(self.result, done=not self._thread.is_alive())

    def _run(self) -> None:
        c = self.compiled
        # an export that failed is known before the snapshot goes: its version carries the cause, so a
        # restarted process that finds no package says why (compiled.py), not only "no package"
        meta = {support.PACKAGE_FAILED: self._not_exported[:support.META_CHARS]} if self._not_exported else None
        try:
            self.result["snapshot"] = c.client.publish(c.name, c.shape, c.tags, meta=meta).to_dict()
        except Exception as exc:  # noqa: BLE001 - a failed publish never hurts the serving process
            self.result["snapshot"] = {"error": _why(exc)}
            log.warning("cachesvc compile %s: the snapshot publish failed: %s", c.name, _why(exc))
        if c.route != "aoti":
            self.result["artifact"] = {"skipped": f"route {c.route}: {c.route_reason}"}
            return
        try:
            self.result["artifact"] = self._artifact()
        except Exception as exc:  # noqa: BLE001 - as above; the next miss tries again
            self.result["artifact"] = {"error": _why(exc)}
            log.warning("cachesvc compile %s: the precompiled artifact was not published: %s", c.name, _why(exc))
        finally:
            if self._work:
                shutil.rmtree(self._work, ignore_errors=True)

    def _artifact(self) -> Dict[str, Any]:
        c = self.compiled
        why = support.support()
        if why:
            return {"skipped": why}
        if self._known_failure:
            return {"skipped": f"the process that compiled this key published no package: {self._known_failure}"}
        if self._not_exported or not self._work:
            raise CacheClientError(self._not_exported or "the model was not exported")
        path = os.path.join(self._work, onefile.FILENAMES[support.KIND])
        started = time.monotonic()
        # the tensors the computation makes travel in the package only where the proof says the trace read no
        # tensor outside the model and the call (one in a global is the live process's), and every plain
        # attribute it read is a buffer of the program (export.bind_attributes), not a constant to carry
        carry = not self._proof.reads_inputs and set(self._proof.attributes) <= set(self._bound)
        phases = build.build(os.path.join(self._work, "exported.pt2"), path, mode=c.mode, imports=self._imports,
                             carry=carry)
        build_seconds = time.monotonic() - started
        carried = computed.attach(path)
        if carried:
            log.info("cachesvc compile %s: the package carries %d tensor(s) its computation makes", c.name, carried)
        checked = time.monotonic()
        failed = verify.verify(path, c.model, c.example_inputs, c.device, calls=c.spec.calls, imports=self._imports,
                               cuda_graph=c.cuda_graph, optional=[end.call for end in self._ends],
                               attributes=self._bound)
        self._proof = ends.settle(c, self._proof, self._ends, failed)
        proof.attach(path, self._proof)
        check_seconds = time.monotonic() - checked
        meta = dict(support.host_meta(c.device), structure=c.tags["structure"])
        if c.spec.dynamic:  # the ranges the package serves (narrower than declared where export said so)
            meta[support.SERVED] = c.spec.served_text()[:support.META_CHARS]
        # through the client's door, as any caller publishes a package: the torch version, the inputs'
        # signature and the device go into the metadata there, this host's and the ranges' here
        key = self.key
        report = c.client.publish_precompiled(key["name"], key["shape"], path, support.KIND, key["tags"],
                                              example_inputs=c.example_inputs, device=c.device, env=key["env"],
                                              compile_seconds=build_seconds, meta=meta)
        log.info("cachesvc compile %s: published the precompiled artifact (built in %.1f s: %s; checked in %.1f s): %s",
                 c.name, build_seconds, _phase_summary(phases), check_seconds, report.summary())
        return dict(report.to_dict(), build_s=build_seconds, build_phases=phases, check_s=check_seconds,
                    proof={"guards": self._proof.guards, "capture_s": round(self._proof.seconds, 3),
                           "bytes": len(self._proof.data)}, exported=self.exported)


#: how long an exiting process waits for its publish (a package build is tens of seconds on a CPU)
AT_EXIT_S = 300.0


def _at_exit_seconds() -> float:
    given = settings.current().publish_at_exit
    try:
        return max(0.0, float(given if given is not None else AT_EXIT_S))
    except ValueError:
        log.warning("cachesvc compile: %s=%r is not a number of seconds; using %.0f",
                    AT_EXIT_VAR, given, AT_EXIT_S)
        return AT_EXIT_S


def _phase_summary(phases: Dict[str, float]) -> str:
    return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items()) or "no timers"


def _why(exc: BaseException) -> str:
    return exc.message if isinstance(exc, CacheClientError) else f"{type(exc).__name__}: {exc}"
