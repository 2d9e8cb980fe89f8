"""compile()'s checks that need no compile: the input spec, the structure fingerprint, the route choice."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cachesvc_client.one_call import calls, spec as compile_spec  # noqa: E402
from cachesvc_client.one_call import choose_route  # noqa: E402
from cachesvc_client.errors import CacheClientError  # noqa: E402


def mlp(hidden=16):
    return torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2)).eval()


def test_the_spec_accepts_only_the_inputs_it_was_built_for():
    model, x = mlp(), torch.randn(4, 8)
    spec = calls.CallSpec((x,), None, training=False)
    assert spec.mismatch((torch.randn(4, 8),), {}, model) is None
    cases = [
        ((torch.randn(5, 8),), "shape"),
        ((torch.randn(4, 8, dtype=torch.float64),), "dtype"),
        ((torch.randn(4, 8, requires_grad=True),), "requires_grad"),
        ((torch.randn(8, 4).t(),), "strides"),
        ((x, x), "2 inputs"),
        ((3.0,), "not a tensor"),
    ]
    for args, word in cases:
        assert word in spec.mismatch(args, {}, model)
    assert "keyword" in spec.mismatch((x,), {"y": x}, model)
    assert "training" in spec.mismatch((x,), {}, model.train())


def test_autograd_wanted_is_a_fallback_reason():
    model, x = mlp(), torch.randn(4, 8)
    assert "autograd" in compile_spec.grad_wanted((x,), model)
    with torch.no_grad():
        assert compile_spec.grad_wanted((x,), model) is None


def test_the_fingerprint_changes_with_the_structure_not_the_weights():
    a, b = mlp(), mlp()
    assert compile_spec.structure_fingerprint(a) == compile_spec.structure_fingerprint(b)
    assert compile_spec.structure_fingerprint(a) != compile_spec.structure_fingerprint(mlp(hidden=32))
    assert compile_spec.structure_fingerprint(a) != compile_spec.structure_fingerprint(a.to(torch.float64))


def test_the_route_is_aoti_for_tensors_and_inductor_else_torch(monkeypatch):
    monkeypatch.delenv("CACHESVC_COMPILE_ROUTE", raising=False)
    x = torch.randn(2, 8)
    assert choose_route((x,), {})[0] == "aoti"
    assert choose_route((x,), {"backend": "eager"})[0] == "torch"
    assert choose_route((x, 3), {})[0] == "torch"
    monkeypatch.setenv("CACHESVC_COMPILE_ROUTE", "torch")
    assert choose_route((x,), {})[0] == "torch"
    monkeypatch.setenv("CACHESVC_COMPILE_ROUTE", "nope")
    with pytest.raises(CacheClientError, match="aoti, torch"):
        choose_route((x,), {})


def test_reduce_overhead_replays_the_package_from_a_cuda_graph_on_a_gpu_only():
    from cachesvc_client.one_call.support import wants_cuda_graph

    x = torch.randn(2, 8)
    assert choose_route((x,), {})[0] == "aoti"  # every mode takes the package; reduce-overhead adds a graph
    assert wants_cuda_graph("reduce-overhead", "cuda:0") and wants_cuda_graph("max-autotune", "cuda") is False
    assert not wants_cuda_graph("reduce-overhead", "cpu") and not wants_cuda_graph(None, "cuda:0")


def test_importing_the_client_with_compile_imports_no_torch():
    import json
    import subprocess
    import sys

    code = "import json, sys, cachesvc_client; cachesvc_client.compile; print(json.dumps('torch' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) is False


def test_compile_stays_the_function_whichever_submodule_was_imported_first():
    """When the function lived in cachesvc_client/compile.py, importing that module (as a test or a user
    might) set the package's ``compile`` attribute to the module: ``cachesvc_client.compile(...)`` then
    raised "'module' object is not callable"."""
    import subprocess
    import sys

    code = ("import cachesvc_client.one_call, cachesvc_client.one_call.publisher, cachesvc_client.one_call.spec, "
            "cachesvc_client; f = cachesvc_client.compile; "
            "assert callable(f) and f.__module__ == 'cachesvc_client.one_call', f")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_keyword_calls_match_by_name_in_any_order_and_the_package_gets_them_sorted():
    ids, mask = torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)
    spec = calls.CallSpec((), {"input_ids": ids, "attention_mask": mask}, training=False)
    model = mlp()
    assert spec.mismatch((), {"attention_mask": mask, "input_ids": ids}, model) is None
    assert spec.flat((), {"input_ids": ids, "attention_mask": mask})[0] is mask  # sorted: attention_mask first
    assert "keyword arguments ['input_ids']" in spec.mismatch((), {"input_ids": ids}, model)
    assert "keyword arguments" in spec.mismatch((ids,), {"attention_mask": mask}, model)
    assert "input 1: shape (2, 6)" in spec.mismatch((), {"input_ids": torch.zeros(2, 6, dtype=torch.long),
                                                         "attention_mask": mask}, model)


def test_dynamic_dims_serve_their_range_and_keep_dims_of_one_name_equal():
    from torch.export import Dim

    x = torch.randn(4, 8)
    model = mlp()
    batch = Dim("batch", min=1, max=16)
    spec = calls.CallSpec((x,), None, False, dynamic_shapes=({0: batch},), forward=model.forward)
    assert spec.mismatch((torch.randn(16, 8),), {}, model) is None and spec.mismatch((torch.randn(1, 8),), {}, model) is None
    assert "outside the declared batch in [1, 16]" in spec.mismatch((torch.randn(17, 8),), {}, model)
    assert "shape (4, 9)" in spec.mismatch((torch.randn(4, 9),), {}, model)  # an undeclared dim stays fixed
    assert "not contiguous" in spec.mismatch((torch.randn(8, 4).t(),), {}, model)
    assert spec.signature("f32[4,8]") == "f32[4,8]|dynamic=(batch:1..16,8)"
    exported = spec.export_dynamic_shapes(model.forward, (x,), None)["input"][0]  # a Dim made anew, same range
    assert (exported.__name__, exported.min, exported.max) == ("batch", 1, 16)
    seq = Dim("seq", min=2, max=32)
    ids, mask = torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)
    two = calls.CallSpec((), {"input_ids": ids, "attention_mask": mask}, False,
                         dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}})
    assert "but seq is 7" in two.mismatch((), {"input_ids": torch.zeros(2, 9, dtype=torch.long),
                                               "attention_mask": torch.ones(2, 7, dtype=torch.long)}, model)
    with pytest.raises(ValueError, match="Dim"):
        calls.CallSpec((x,), None, False, dynamic_shapes=({0: Dim.AUTO},), forward=model.forward)
    with pytest.raises(ValueError, match="does not pass"):
        calls.CallSpec((x,), None, False, dynamic_shapes={"y": {0: batch}}, forward=model.forward)


def test_declared_examples_serve_exactly_those_shapes_from_one_dynamic_package():
    model = mlp()
    spec = calls.CallSpec((torch.randn(2, 8),), None, False, examples=[(torch.randn(4, 8),), (torch.randn(8, 8),)],
                          forward=model.forward)
    assert [t.text() for t in spec.tensors] == ["(d0:2..8, 8)"]
    for n in (2, 4, 8):
        assert spec.mismatch((torch.randn(n, 8),), {}, model) is None
    assert "not among the 3 declared" in spec.mismatch((torch.randn(3, 8),), {}, model)
    assert spec.signature("f32[2,8]") == "f32[2,8]|examples=2x8;4x8;8x8"
    assert len(spec.calls) == 3  # the publish check runs every declared shape
    with pytest.raises(ValueError, match="once"):
        calls.CallSpec((torch.randn(2, 8),), None, False, examples=[(torch.randn(4, 8),)], dynamic_shapes=({},))


def reference_match(spec, args, kwargs, model):
    """The spec's answer with every call flattened by pytree (what ``match`` did before its plain path)."""
    got = tuple(sorted(kwargs or {}))
    if got != spec.keywords:
        return "keyword", None
    flat, structure = calls.leaves(args, kwargs)
    if len(flat) != len(spec.tensors) or structure != spec.structure:
        return "structure", None
    why, served = calls.CallSpec.match(spec, args, kwargs, model)  # the rest of the checks, on pytree's leaves
    return why, flat if why is None else None


def test_a_call_of_plain_tensors_is_flattened_as_pytree_flattens_it():
    """The served call's flatten skips pytree where the example and the call are plain tensors: for random
    examples and calls (nested, keyword, non-tensor, subclassed, reordered), the answer is pytree's."""
    from hypothesis import given, settings, strategies as st

    model = mlp()
    a, b = torch.randn(4, 8), torch.randn(2, 3)
    leaf = st.sampled_from([a, b, torch.randn(4, 8), torch.nn.Parameter(torch.randn(4, 8)), 3, None, "s"])
    arg = st.one_of(leaf, st.tuples(leaf, leaf), st.lists(leaf, max_size=2))
    keywords = st.dictionaries(st.sampled_from(["x", "mask", "y"]), arg, max_size=2)
    plain_example = st.sampled_from([((a,), {}), ((a, b), {}), ((), {"x": a, "mask": b}), ((a,), {"mask": b})])

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(plain_example, st.lists(arg, max_size=3), keywords, st.booleans())
    def check(example, args, kwargs, reorder):
        spec = calls.CallSpec(example[0], example[1], training=False)
        assert spec._plain  # the example's arguments are tensors: the plain path is on
        if reorder:
            kwargs = dict(reversed(list(kwargs.items())))
        why, flat = spec.match(tuple(args), kwargs, model)
        want_why, want_flat = reference_match(spec, tuple(args), kwargs, model)
        assert (why is None) == (want_why is None), (why, want_why)
        if why is None:
            assert len(flat) == len(want_flat) and all(x is y for x, y in zip(flat, want_flat))
        # the example's own call, its keywords in the example's order and reversed, is served as pytree serves it
        for given in (example[1], dict(reversed(list(example[1].items())))):
            why, flat = spec.match(example[0], given, model)
            assert why is None and all(x is y for x, y in zip(flat, calls.leaves(*example)[0], strict=True))

    check()


def test_a_hits_background_work_starts_once_and_its_trouble_stays_a_log_line(monkeypatch, caplog):
    """compiled.py: a hit starts its snapshot restore and learned packages in the first call's path, after
    its output: once, whoever asks again, and a failure to start them is a log line, never the call's error."""
    import threading
    import types

    from cachesvc_client.one_call import compiled, learned

    started = []

    def refuse(_compiled):
        started.append("learned")
        raise RuntimeError("no thread for you")

    monkeypatch.setattr(learned, "start", refuse)
    released = []
    hold = types.SimpleNamespace(release=lambda: released.append(1))  # compile()'s hold on full collections
    hit = types.SimpleNamespace(_background_lock=threading.Lock(), _deferred=True, _down=False, phases={},
                                name="tiny", _learned=None, _start_snapshot_restore=lambda: started.append("snapshot"),
                                gc_hold=hold)
    with caplog.at_level("WARNING", logger="cachesvc_client"):
        for _ in range(3):
            compiled.CompiledModel._start_deferred(hit)
    assert started == ["snapshot", "learned"] and hit._learned is None and hit.phases["deferred"] >= 0
    assert released  # the hold is let go first (its release is idempotent: collector.FullCollectionHold)
    assert "the learned packages are not fetched: no thread for you" in caplog.text


EXITS_IN_THE_PAUSE = """
import sys, threading, time, types
from cachesvc_client.one_call import deferred

hit = types.SimpleNamespace(_background_lock=threading.Lock(), _deferred=True, _down=False, phases={}, name="tiny",
                            _learned=None, gc_hold=None,
                            _start_snapshot_restore=lambda: print("snapshot started", flush=True))
deferred.after_first_output(hit, lambda: print("reported", flush=True))
print("exiting", flush=True)
exiting = time.monotonic()
import atexit
atexit.register(lambda: print(f"exited in {time.monotonic() - exiting:.2f} s", flush=True))
"""


def test_a_process_that_exits_in_the_pause_after_its_first_output_reports_the_hit_and_starts_nothing(tmp_path):
    """A hit's background work waits a moment after the first output (deferred.py): a process that exits in
    that pause still tells the service of its hit, and neither waits out the pause nor starts the snapshot
    restore and the learned packages (a short-lived process needs none of them), silently."""
    import subprocess
    import sys

    from cachesvc_client.one_call import deferred

    script = tmp_path / "exits.py"
    script.write_text(EXITS_IN_THE_PAUSE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not done.stderr, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[:2] == ["exiting", "reported"] and len(lines) == 3, lines  # no "snapshot started"
    assert float(lines[2].split()[2]) < deferred.START_AFTER_OUTPUT_S / 2, lines  # the pause cut short
