"""torch's structured trace handler, set aside while a proof's guard trees are built, where it writes nothing.

torch hands its structured trace log each guard tree it builds as text (``dynamo_cpp_guards_str``, in
``CheckFunctionManager``): a walk of every node, 0.16 s of BERT-large's 0.59 s tree on this CPU under a
profiler. It formats the text whenever the log has a handler, and installs one in every process
(``LazyTraceHandler``) whether or not ``TORCH_TRACE`` names a folder; outside Meta's infrastructure (torch
built with a ``git_version``, no ``MAST_HPC_JOB_NAME``) that handler opens no file, drops the record and
detaches itself, at the first record the process logs. In a restart the package serves, the proof's tree is
that first record, so its text was made for nothing. ``dropped_records()`` detaches exactly such handlers
while the trees are built and puts them back after (the process's next record, if any, ends them as torch
would); a handler that may write (``TORCH_TRACE`` set, a file open, anyone else's) stays, and the text is
made for it.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, List


def _drops_everything(handler: object) -> bool:
    """Whether ``handler`` is torch's lazy trace handler in the state where its ``emit`` writes nothing."""
    import torch.version
    from torch._logging._internal import LazyTraceHandler

    return (type(handler) is LazyTraceHandler and handler.root_dir is None and handler.stream is None
            and hasattr(torch.version, "git_version") and os.getenv("MAST_HPC_JOB_NAME") is None)


@contextlib.contextmanager
def dropped_records() -> Iterator[None]:
    """Inside: torch's trace log without the handlers that would drop what it is given."""
    from torch._logging._internal import trace_log

    idle: List[object] = [h for h in list(trace_log.handlers) if _drops_everything(h)]
    for handler in idle:
        trace_log.removeHandler(handler)
    try:
        yield
    finally:
        for handler in idle:
            trace_log.addHandler(handler)
