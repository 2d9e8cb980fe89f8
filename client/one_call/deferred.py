"""A hit's background work, begun a moment after its first call has an output: the hit's report to the
service, the key's snapshot restore (so a call off the spec compiles from Inductor's cache) and the
learned packages of the other shapes.

Started in compile() it shared the interpreter with the package's first run, the part of the first output
the one call changes; started inside the first call it still ran before that call returned (0.24-0.27 s of a
Llama-family restart's first call on an H100, 2026-12-06, most of it the collection compile()'s hold had
put off). Started in a thread as the first call returned, it still ran beside what the caller does with that
output (a synchronize, a copy, a response): on an H100, four of five BERT-large and three of five T5-large
restarts reached their first output about 0.14 s later than compile() and the package's run add up to, the
others within 0.01 s (2026-12-07). So the thread waits ``START_AFTER_OUTPUT_S`` first, as the hold on the full collections (process/collector.py) does. A call
the package does not serve, ``warm_up()`` and a wait for the snapshot start the work at once, in the calling
thread, and end the hold: torch.compile's allocations come next, and are its to pay. A process that exits
during the pause sends the report and starts nothing else: a short-lived process needs none of it.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from . import learned as learned_mod
from ..process import exits

log = logging.getLogger("cachesvc_client")
#: how long after a hit's first output the full collections stay held (the hold's own bound is 30 s)
GC_HOLD_AFTER_OUTPUT_S = 1.0
#: how long after a hit's first output its background work waits, unless a call needs it sooner
START_AFTER_OUTPUT_S = 1.0
#: how long an exiting process waits for the report (the request is bounded by the client's timeout too)
AT_EXIT_S = 5.0


def after_first_output(compiled: Any, report: Optional[Callable[[], None]] = None) -> None:
    """The first served call has its output: end the hold shortly, and in a thread, after a pause, send
    ``report`` (the hit's, to the service) and start the background work."""
    if compiled.gc_hold is not None:
        compiled.gc_hold.release_after(GC_HOLD_AFTER_OUTPUT_S)
    if report is None and not compiled._deferred:
        return
    exiting = threading.Event()
    thread = threading.Thread(target=_after_pause, args=(compiled, report, exiting),
                              name=f"cachesvc-deferred-{compiled.name}", daemon=True)
    try:
        thread.start()
    except RuntimeError as exc:  # the interpreter is shutting down: a short-lived process needs none of it
        log.debug("cachesvc compile %s: the background work did not start: %s", compiled.name, exc)
        return
    compiled._deferred_thread = thread
    exits.at_exit(lambda: (exiting.set(), thread.join(AT_EXIT_S)))


def _after_pause(compiled: Any, report: Optional[Callable[[], None]], exiting: threading.Event) -> None:
    exiting.wait(START_AFTER_OUTPUT_S)
    if report is not None:
        report()
    if not exiting.is_set():
        start(compiled, False)


def start(compiled: Any, release_hold: bool = True) -> None:
    """The background work, once (``compiled._deferred``); its seconds are ``phases["deferred"]``, spent after
    compile() returned (not in "total"). ``release_hold``: end the hold on the full collections first."""
    if release_hold and compiled.gc_hold is not None:
        compiled.gc_hold.release()
    with compiled._background_lock:
        if not compiled._deferred:
            return
        compiled._deferred = False
        started = time.monotonic()
        compiled._start_snapshot_restore()
        if not compiled._down:
            try:
                compiled._learned = learned_mod.start(compiled)
            except Exception as exc:  # noqa: BLE001 - beside the serving: its calls are served either way
                log.warning("cachesvc compile %s: the learned packages are not fetched: %s", compiled.name, exc)
        compiled.phases["deferred"] = round(time.monotonic() - started, 4)


def wait(compiled: Any, timeout: float) -> None:
    """Until the first output's background start has run (tests, and a wait for the snapshot)."""
    thread = getattr(compiled, "_deferred_thread", None)
    if thread is not None:
        thread.join(timeout)
