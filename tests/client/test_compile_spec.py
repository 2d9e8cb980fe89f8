"""compile()'s checks that need no compile: the input spec, the structure fingerprint, the route choice."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cachesvc_client.one_call import spec as compile_spec  # noqa: E402
from cachesvc_client.one_call import choose_route  # noqa: E402
from cachesvc_client.errors import CacheClientError  # noqa: E402


def mlp(hidden=16):
    return torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2)).eval()


def test_the_spec_accepts_only_the_inputs_it_was_built_for():
    model, x = mlp(), torch.randn(4, 8)
    spec = compile_spec.InputSpec((x,), training=False)
    assert spec.mismatch((torch.randn(4, 8),), {}, model) is None
    cases = [
        ((torch.randn(5, 8),), "shape"),
        ((torch.randn(4, 8, dtype=torch.float64),), "dtype"),
        ((torch.randn(4, 8, requires_grad=True),), "requires_grad"),
        ((torch.randn(8, 4).t(),), "strides"),
        ((x, x), "2 inputs"),
        (([1.0] * 8,), "not a tensor"),
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
