"""The cyclic garbage collector's seconds inside a stretch of work (``compile()``'s ``phases["gc"]``).

A collection runs in whichever thread allocated past the threshold, inside whatever code that thread
was running, so a profiler books it to an innocent line (a deque's append in the key's walk, Dynamo's
TENSOR_MATCH in the proof). A full collection of a process that has imported torch and built a model walks
every object it holds: tenths of a second that look like the one call's own cost. This clock counts them
apart. ``hold_full_collections`` holds off the full ones (only those) from compile() to just after its first
output: the debt is the process's (its imports, its model), which eager pays whenever it next allocates
enough.
Turning the collector off altogether would also stop the young collections and let the heap grow.
"""
from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any, Dict, Optional, Tuple

#: the oldest generation's number: a collection of it walks every tracked object
OLDEST = len(gc.get_count()) - 1


class CollectorClock:
    """``with CollectorClock() as clock: ...``; then ``clock.seconds`` (all collections, any thread) and
    ``clock.full`` (how many were of the oldest generation). Collections run one at a time, under the GIL,
    so one start time serves."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._began: Optional[float] = None

    def _callback(self, phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            self.seconds += time.perf_counter() - self._began
            self._began = None
            if info.get("generation") == OLDEST:
                self.full += 1

    def __enter__(self) -> "CollectorClock":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            gc.callbacks.remove(self._callback)
        except ValueError:  # someone cleared gc.callbacks: nothing left to remove
            pass


#: what the oldest generation's threshold is raised to while held: more young collections than a process makes
_NEVER = 1 << 30
_lock = threading.Lock()
_holders = 0
_saved: Optional[Tuple[int, ...]] = None


class FullCollectionHold:
    """The oldest generation's collections held off from ``hold_full_collections()`` until ``release()`` (once;
    later calls do nothing) or ``max_s`` seconds, whichever comes first. Young collections run as always."""

    def __init__(self, max_s: float) -> None:
        self._released = False
        self._timer = threading.Timer(max_s, self.release)
        self._timer.daemon = True

    def release_after(self, seconds: float) -> None:
        """End the hold ``seconds`` from now instead (sooner than ``max_s``, or later): a hit's first output
        moves it past the first call's return, so the collection it lets loose does not land inside it."""
        with _lock:
            if self._released:
                return
            self._timer.cancel()
            timer = self._timer = threading.Timer(seconds, self.release)
            timer.daemon = True
        try:
            timer.start()
        except RuntimeError:  # the interpreter is shutting down: no thread to end it later, so now
            self.release()

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        global _holders, _saved
        with _lock:
            if self._released:
                return
            self._released = True
            self._timer.cancel()
            _holders -= 1
            if _holders == 0 and _saved is not None:
                if gc.get_threshold()[OLDEST] == _NEVER:  # else someone set their own since: theirs stays
                    gc.set_threshold(*_saved)
                _saved = None


def _after_fork_in_child() -> None:
    """A child forked while a hold was on (a DataLoader's workers started before the first call) has no timer
    and no first output of its own to end it: it starts with the thresholds the hold had saved."""
    global _holders, _saved, _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    if _holders and _saved is not None and gc.get_threshold()[OLDEST] == _NEVER:
        gc.set_threshold(*_saved)
    _holders, _saved = 0, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def hold_full_collections(max_s: float = 30.0) -> FullCollectionHold:
    """Hold the collector's full collections while the one call starts (``compile()`` to just after its first
    output).

    The process that imported torch and built a model owes the collector a full collection, and the one call's
    allocations (the key's walk, the proof's guards) would set it off inside compile(): a walk of every object the
    process holds, 0.13 s of a Llama-family restart's 0.39 s on an H100 (docs/benchmarks.md). Eager pays that debt
    whenever it next allocates enough, in its first calls; held here, the one call pays it at the same kind of
    moment, after its first output, rather than inside its start. The hold ends at ``release()`` or after
    ``max_s`` (a process that never calls the model does not keep it). Nested holds (threads compiling several
    models) end with the last. CPython 3.14's incremental collector ignores the oldest threshold: there it is a
    no-op. ``CACHESVC_GC_HOLD=0`` turns it off (compile() then does not call this)."""
    global _holders, _saved
    hold = FullCollectionHold(max_s)
    with _lock:
        if _holders == 0:
            current = gc.get_threshold()
            if current[OLDEST] != _NEVER:
                _saved = current
                gc.set_threshold(*current[:OLDEST], _NEVER)
        _holders += 1
    hold._timer.start()
    return hold
