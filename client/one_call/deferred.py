"""A hit's background work, started once its first call has an output: the key's snapshot restore (so a
call off the spec compiles from Inductor's cache) and the learned packages of the other shapes.

Started in compile() it shared the interpreter with the package's first run, the part of the first output
the one call changes; started inside the first call it still ran before that call returned (0.24-0.27 s of a
Llama-family restart's first call on an H100, 2026-12-06, most of it the collection compile()'s hold had
put off). So the first output starts it in a thread of its own and returns, and the hold on the full
collections (process/collector.py) ends a moment later, not inside the first call. A call the package does
not serve, ``warm_up()`` and a wait for the snapshot start it at once, in the calling thread, and end the
hold: torch.compile's allocations come next, and are its to pay.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from . import learned as learned_mod
from ..process import exits

log = logging.getLogger("cachesvc_client")
#: how long after a hit's first output the full collections stay held (the hold's own bound is 30 s)
GC_HOLD_AFTER_OUTPUT_S = 1.0
#: how long an exiting process waits for that start
AT_EXIT_S = 5.0


def after_first_output(compiled: Any) -> None:
    """The first served call has its output: start the background work in a thread, end the hold shortly."""
    if compiled.gc_hold is not None:
        compiled.gc_hold.release_after(GC_HOLD_AFTER_OUTPUT_S)
    if not compiled._deferred:
        return
    thread = threading.Thread(target=start, args=(compiled, False), name=f"cachesvc-deferred-{compiled.name}",
                              daemon=True)
    try:
        thread.start()
    except RuntimeError as exc:  # the interpreter is shutting down: a short-lived process needs none of it
        log.debug("cachesvc compile %s: the background work did not start: %s", compiled.name, exc)
        return
    compiled._deferred_thread = thread
    # a process that exits right after its first output lets the start finish first (tens of milliseconds), as
    # when it ran inside the first call: what it starts has its own exits (restore/outcome.py, learned.py)
    exits.at_exit(lambda: thread.join(AT_EXIT_S))


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
