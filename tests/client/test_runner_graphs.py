"""reduce-overhead on a hit: when the package's run is captured into a CUDA graph (one_call/runner.py).

The first call of an input shape runs the package as it is (the first output pays no capture), the second
captures, later calls replay; a rebind drops the graphs and the shape's next call captures again. The CUDA
graph itself (graph.py) needs a GPU: tests/e2e/test_gpu_compile.py runs it for real; here the loader and the
capture are stand-ins so that the order of runs is what is checked.
"""
from __future__ import annotations

from types import SimpleNamespace

from cachesvc_client.one_call import runner as runner_mod


class Loader:
    def __init__(self):
        self.runs = 0

    def run(self, args):
        self.runs += 1
        return ["plain"]

    def load_constants(self, *_):
        pass


def graphed_runner(monkeypatch):
    runner = runner_mod.Runner.__new__(runner_mod.Runner)
    runner._loader, runner._fqns, runner._out_spec = Loader(), [], None
    runner._unflatten = lambda leaves, spec: leaves[0]
    runner.cuda_graph, runner._graphs, runner._ran = True, {}, set()
    runner.capture_seconds, runner.capture_phases, runner.capture_error = None, {}, ""
    captured = []

    def capture(shapes, args):
        captured.append(shapes)
        runner._graphs[shapes] = lambda a: ["replayed"]
        return runner._graphs[shapes]

    monkeypatch.setattr(runner, "_capture", capture)
    return runner, captured


def tensor(*shape):
    return SimpleNamespace(shape=shape)


def test_the_first_call_of_a_shape_runs_plain_the_second_captures_later_ones_replay(monkeypatch):
    runner, captured = graphed_runner(monkeypatch)
    assert runner(tensor(4, 8)) == "plain" and captured == [] and runner._loader.runs == 1
    assert runner(tensor(4, 8)) == "replayed" and captured == [((4, 8),)]
    assert runner(tensor(4, 8)) == "replayed" and captured == [((4, 8),)] and runner._loader.runs == 1
    # another shape: its own first call is plain too
    assert runner(tensor(2, 8)) == "plain" and len(captured) == 1
    assert runner(tensor(2, 8)) == "replayed" and captured[-1] == ((2, 8),)


def test_a_rebind_captures_again_at_the_shapes_next_call(monkeypatch):
    runner, captured = graphed_runner(monkeypatch)
    runner(tensor(4, 8))
    runner(tensor(4, 8))
    runner.rebind({})
    assert runner(tensor(4, 8)) == "replayed" and captured == [((4, 8),), ((4, 8),)]


def test_without_cuda_graph_every_call_runs_plain(monkeypatch):
    runner, captured = graphed_runner(monkeypatch)
    runner.cuda_graph = False
    assert [runner(tensor(4, 8)) for _ in range(3)] == ["plain"] * 3 and captured == []
