"""Work a process does as it exits: a publish finishing, a hit's report, the usage counted since the last report."""
from __future__ import annotations

import atexit
import threading
from typing import Callable


def at_exit(hook: Callable[[], None]) -> bool:
    """Run ``hook`` when the interpreter exits, before Python's thread pools refuse new work. False when
    the interpreter is exiting already (an exit hook's join let a thread go on): start nothing then.
    threading's own exit hooks run before the atexit ones, and in reverse order of registration: this
    one, registered after concurrent.futures' (imported here first for that), runs before that hook
    shuts the thread pools a publish uploads with (which then refuse new work: "cannot schedule new
    futures after interpreter shutdown")."""
    import concurrent.futures.thread  # noqa: F401 - its exit hook must be registered before this one

    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(hook)
        else:  # an interpreter without it: atexit runs after the pools shut, but still joins the thread
            atexit.register(hook)
    except RuntimeError:  # already shutting down: nothing more can be scheduled anyway
        return False
    return True
