"""torch's structured trace handler set aside while a proof's trees are built, only where it writes nothing
(client/one_call/proof/tracelog.py): the guard tree's text is not made for a handler that drops it, and is
made for one that writes it."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from torch._logging._internal import LazyTraceHandler, trace_log  # noqa: E402

from cachesvc_client.one_call.proof import tracelog  # noqa: E402


@pytest.fixture
def handlers(monkeypatch):
    """trace_log's handlers, put back as they were after the test."""
    monkeypatch.delenv("MAST_HPC_JOB_NAME", raising=False)
    saved = list(trace_log.handlers)
    yield
    for handler in list(trace_log.handlers):
        trace_log.removeHandler(handler)
    for handler in saved:
        trace_log.addHandler(handler)


def made_inside(handler) -> tuple:
    """Whether torch made a trace payload inside ``dropped_records()`` and after it, with only ``handler``."""
    for other in list(trace_log.handlers):
        trace_log.removeHandler(other)
    trace_log.addHandler(handler)
    made = []
    with tracelog.dropped_records():
        inside = handler in trace_log.handlers
        torch._logging.trace_structured("dynamo_cpp_guards_str", payload_fn=lambda: made.append("in") or "tree")
    after = handler in trace_log.handlers
    # the next record is made for it (torch's idle handler then detaches itself, as at any first record)
    torch._logging.trace_structured("dynamo_cpp_guards_str", payload_fn=lambda: made.append("out") or "tree")
    return made, inside, after


def test_torch_installs_the_handler_that_writes_nothing_without_torch_trace():
    # the premise, in a fresh process: this worker's may already have made a record (an in-process compile of
    # another test), and torch's idle handler then detaches itself
    env = {k: v for k, v in os.environ.items() if k != "TORCH_TRACE"}
    code = ("from torch._logging._internal import LazyTraceHandler, trace_log; "
            "print([type(h).__name__ for h in trace_log.handlers if type(h) is LazyTraceHandler and h.root_dir is None])")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "['LazyTraceHandler']", done.stdout + done.stderr[-2000:]


def test_a_handler_that_drops_everything_is_set_aside_and_put_back(handlers):
    made, inside, after = made_inside(LazyTraceHandler(None))
    assert made == ["out"] and not inside and after  # no tree text made for it; attached again after


def test_a_handler_with_a_folder_or_someone_elses_stays_and_gets_its_text(handlers, tmp_path):
    writing = LazyTraceHandler(str(tmp_path))
    made, inside, after = made_inside(writing)
    writing.close()
    assert made == ["in", "out"] and inside and after
    assert list(tmp_path.iterdir()), "TORCH_TRACE's folder got the trace"
    with open(tmp_path / "theirs.log", "w") as theirs:
        made, inside, after = made_inside(logging.StreamHandler(theirs))
        assert made == ["in", "out"] and inside and after
        for handler in list(trace_log.handlers):
            trace_log.removeHandler(handler)


def test_on_metas_infrastructure_the_lazy_handler_may_write_and_stays(handlers, monkeypatch):
    monkeypatch.setenv("MAST_HPC_JOB_NAME", "job")
    made, inside, _ = made_inside(LazyTraceHandler(None))
    assert made[0] == "in" and inside
