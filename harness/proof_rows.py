"""The proof's attack rows, run in simulated containers (tests/e2e/test_one_call_proof.py).

    python harness/proof_rows.py build DEPLOY            # publish the packages the rows restart against
    python harness/proof_rows.py restart DEPLOY ROW...   # one restarted process, each row in turn
    python harness/proof_rows.py proof DEPLOY            # every file and process row against one proof alone
    python harness/proof_rows.py property DEPLOY N       # random edits against one proof (no package)

DEPLOY is a folder harness/rows_model.py writes; a row edits its files (as a deploy of changed files
would) or the process's state, then calls ``cachesvc_client.compile`` as the restarted process would.
Each prints ``RESULT <json>`` as its last line: per row, what served it (``source``, ``calls``), why not
the package (``why``), and where the package served, its largest difference from eager (``diff``).
"""
from __future__ import annotations

import importlib
import json
import linecache
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import rows_model  # noqa: E402

ROWS = "rows"


def modules(deploy: str, **edits: Any):
    """The deploy's model module, its files written with ``edits`` and imported afresh."""
    rows_model.write(Path(deploy), **edits)
    for name in [m for m in sys.modules if m == "rowmodel" or m == "rowpkg" or m.startswith("rowpkg.")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    linecache.clearcache()
    return importlib.import_module("rowmodel")


def make_rows(module: Any, mode: str = "eval"):
    import torch

    torch.manual_seed(0)
    model = module.attach_hooks(module.Rows())
    with torch.no_grad():  # running statistics that are not the identity
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 1.5)
    return model.train() if mode == "train" else model.eval()


def example(batch: int = 4):
    import torch

    return torch.randn(batch, 8, generator=torch.Generator().manual_seed(1))


def build(deploy: str) -> Dict[str, Any]:
    """Publish the three packages: the rows model in eval and in train mode, and the squeezer over a batch range."""
    import torch

    import cachesvc_client

    module = modules(deploy)
    batch = torch.export.Dim("batch", min=1, max=8)
    out = {}
    for name, model, declared in ((ROWS, make_rows(module), {}), (f"{ROWS}-train", make_rows(module, "train"), {}),
                                  (f"{ROWS}-squeeze", _squeezer(module), {"dynamic_shapes": ({0: batch},)})):
        compiled = cachesvc_client.compile(model, (example(),), name=name, publish=True, **declared)
        with torch.no_grad():
            compiled(example())
        out[name] = compiled.wait_published()
    return out


def _squeezer(module: Any):
    import torch

    torch.manual_seed(0)
    return module.Squeezer().eval()


# -- the rows ------------------------------------------------------------------------------------------

def _diff(got: Any, want: Any) -> float:
    """The largest difference of ``got`` from ``want``, relative to ``want``'s largest magnitude."""
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6))


def load_row(deploy: str, *, edits: Dict[str, Any] = None, change: Callable = None, name: str = ROWS,
             mode: str = "eval") -> Dict[str, Any]:
    """A restart that differs before ``compile()``: edited files, or ``change(module, model)`` (returns its undo)."""
    import torch

    import cachesvc_client

    module = modules(deploy, **(edits or {}))
    model = make_rows(module, mode)
    undo = change(module, model) if change else None
    try:
        compiled = cachesvc_client.compile(model, (example(),), name=name, publish=False, require_hit=False)
        result = {"source": compiled.source, "why": compiled.miss_reason, "calls": dict(compiled.calls)}
        if compiled.source == "artifact":  # the row is served: how far from eager
            with torch.no_grad():
                result["diff"] = _diff(compiled(example()), model(example()))
            result["calls"] = dict(compiled.calls)
    finally:
        if undo:
            undo()
    return result


def call_row(deploy: str, change: Callable, *, require_hit: bool = True) -> Dict[str, Any]:
    """A restart served by the package whose state changes after its first call: ``change(model, x)`` returns
    (a context to call in, the next call's input)."""
    import torch

    import cachesvc_client
    from cachesvc_client.errors import HitRequired

    model, x = make_rows(modules(deploy)), example()
    compiled = cachesvc_client.compile(model, (x,), name=ROWS, publish=False, require_hit=require_hit)
    with torch.no_grad():
        compiled(x)
    context, x = change(model, x)
    result: Dict[str, Any] = {"source": compiled.source}
    try:
        with context:
            got = compiled(x)
            want = model(x)
        result["diff"] = _diff(got, want)
    except HitRequired as exc:
        result["why"] = exc.message
    result["calls"] = dict(compiled.calls)
    return result


def _undo_env(name: str, value: str) -> Callable:
    os.environ[name] = value
    return lambda: os.environ.pop(name, None)


def _patch_gelu(module: Any, model: Any) -> Callable:
    import torch

    original = torch.nn.functional.gelu
    torch.nn.functional.gelu = lambda t, approximate="none": torch.tanh(t)
    return lambda: setattr(torch.nn.functional, "gelu", original)


def _replace_forward(module: Any, model: Any) -> Callable:
    import types

    model.forward = types.MethodType(lambda self, x: type(self).forward(self, x) * 2, model)
    return lambda: model.__dict__.pop("forward", None)


def _global_hook(module: Any, model: Any) -> Callable:
    import torch

    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda m, i, o: o * 1.5 if isinstance(m, torch.nn.Linear) else None)
    return handle.remove


def _patched_method(module: Any, model: Any) -> Callable:
    """A method of the model's class replaced in the serving process, before compile()."""
    original = module.Rows.extra
    module.Rows.extra = lambda self, y: y * 2
    return lambda: setattr(module.Rows, "extra", original)


def _mutated_global(module: Any, model: Any) -> Callable:
    """A module-level dict the forward reads, changed in the serving process before compile()."""
    module.TABLE["bias"] = 0.4
    return lambda: module.TABLE.__setitem__("bias", rows_model.DEFAULTS["table_bias"])


def _transposed_weight(module: Any, model: Any) -> None:
    import torch

    model.mid.weight = torch.nn.Parameter(model.mid.weight.detach().t().contiguous().t())  # same values


def _channels_last(module: Any, model: Any) -> None:
    import torch

    model.to(memory_format=torch.channels_last)


FILE_ROWS = {"class_constant": {"scale": 1.5}, "enum_value": {"enum_a": 1.5}, "global_dataclass": {"global_gain": 0.6},
             "global_partial": {"slope": 0.2}, "lru_cache_body": {"lru_k": 0.5}, "pkg_sub_helper": {"sub_k": 1.0},
             "jit_helper": {"jit_k": 2.0}, "attr_dataclass": {"attr_gain": 1.0}, "attr_callable": {"call_k": 1.5},
             "attr_dict": {"dict_k": 4}, "attr_numpy": {"np_k": 0.7}, "hook_partial": {"hook_k": 1.3},
             "hook_stateful": {"stateful_k": 0.9}, "global_dict_item": {"table_bias": 0.5},
             "closure_cell": {"closure_k": 0.9}}
CHANGE_ROWS = {"env_var": lambda m, model: _undo_env("ROWS_FLAG", "1"), "monkeypatched_gelu": _patch_gelu,
               "forward_replaced": _replace_forward, "global_hook": _global_hook,
               "transposed_weight": _transposed_weight, "channels_last": _channels_last,
               "patched_method": _patched_method, "mutated_global": _mutated_global}


def _grad_enabled(model: Any, x: Any):
    import torch

    model.requires_grad_(False)  # nothing wants a graph: only the forward's is_grad_enabled() branch differs
    return torch.enable_grad(), x


def _autocast(model: Any, x: Any):
    import contextlib

    import torch

    both = contextlib.ExitStack()
    both.enter_context(torch.no_grad())  # only autocast differs from the build's state
    both.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
    return both, x


def _no_grad_after(change: Callable) -> Callable:
    def row(model: Any, x: Any):
        import torch

        return torch.no_grad(), change(model, x)
    return row


CALL_ROWS = {
    "grad_enabled": _grad_enabled, "autocast": _autocast,
    "train_after_hit": _no_grad_after(lambda model, x: (model.train(), x)[1]),
    "hook_after_hit": _no_grad_after(lambda model, x: (model.enc.register_forward_hook(lambda m, i, o: o * 2), x)[1]),
    "strided_input": _no_grad_after(lambda model, x: x.t().contiguous().t()),
    "swapped_submodule": _no_grad_after(lambda model, x: (_swap_norm(model), x)[1]),
    "untied_weight": _no_grad_after(lambda model, x: (_untie(model), x)[1]),
}


def _swap_norm(model: Any) -> None:
    """Another BatchNorm in ``bn``'s slot: the same class, its own statistics."""
    import torch

    fresh = type(model.bn)(8).eval()
    with torch.no_grad():
        fresh.running_mean.uniform_(-1.0, 1.0)
        fresh.weight.mul_(1.5)
    model.bn = fresh


def _untie(model: Any) -> None:
    import torch

    model.dec.weight = torch.nn.Parameter(model.enc.weight.detach().clone() * 1.5)


def built_in_train(deploy: str) -> Dict[str, Any]:
    """The package was built from a model its builder forgot to put in eval mode; the restart is in eval (if
    the package served it, the call would also move the live running statistics, as train mode does)."""
    import torch

    import cachesvc_client

    model = make_rows(modules(deploy))
    before = model.bn.running_mean.clone()
    compiled = cachesvc_client.compile(model, (example(),), name=f"{ROWS}-train", publish=False, require_hit=False)
    result = {"source": compiled.source, "why": compiled.miss_reason}
    if compiled.source == "artifact":
        with torch.no_grad():
            result["diff"] = _diff(compiled(example()), model(example()))
    result["running_mean_moved"] = not torch.equal(before, model.bn.running_mean)
    result["calls"] = dict(compiled.calls)
    return result


def squeeze_ends(deploy: str) -> Dict[str, Any]:
    """A declared batch range 1..8 over a ``squeeze()``: batch 1 is another computation."""
    import torch

    import cachesvc_client
    from cachesvc_client.errors import HitRequired

    model = _squeezer(modules(deploy))
    batch = torch.export.Dim("batch", min=1, max=8)
    compiled = cachesvc_client.compile(model, (example(),), name=f"{ROWS}-squeeze", publish=False,
                                       require_hit=True, dynamic_shapes=({0: batch},))
    out: Dict[str, Any] = {"source": compiled.source}
    for size in (4, 8, 2, 1):
        x = example(size)
        try:
            with torch.no_grad():
                got, want = compiled(x), model(x)
            out[str(size)] = {"shape": list(got.shape), "eager_shape": list(want.shape), "diff": _diff(got, want)}
        except HitRequired as exc:
            out[str(size)] = {"why": exc.message}
    out["calls"] = dict(compiled.calls)
    return out


CHAIN = "def h{i}(x):\n    return h{j}(x) + 0\n\n\n"


def helper_chain(deploy: str, length: int = 340) -> Dict[str, Any]:
    """A forward reaching a chain of ``length`` helpers in the deploy's own code: compile() must not raise."""
    source = "import torch\nfrom torch import nn\n\n\n" + "".join(CHAIN.format(i=i, j=i + 1) for i in range(length))
    source += f"def h{length}(x):\n    return x * 2\n\n\nclass Chain(nn.Module):\n    def __init__(self):\n" \
              "        super().__init__()\n        self.fc = nn.Linear(8, 8)\n\n    def forward(self, x):\n" \
              "        return h0(self.fc(x))\n"
    (Path(deploy) / "rowchain.py").write_text(source)
    sys.modules.pop("rowchain", None)
    return _compiles(importlib.import_module("rowchain").Chain(), "rows-chain")


def attrdict_config(deploy: str) -> Dict[str, Any]:
    """``self.config = AttrDict(...)`` (``__getattr__ = dict.__getitem__``): compile() must not raise."""
    import torch

    class AttrDict(dict):
        __getattr__ = dict.__getitem__
        __setattr__ = dict.__setitem__

    class WithConfig(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)
            self.config = AttrDict(hidden=8, scale=0.5)

        def forward(self, x):
            return self.fc(x) * self.config.scale

    return _compiles(WithConfig(), "rows-attrdict")


def _compiles(model: Any, name: str) -> Dict[str, Any]:
    import cachesvc_client

    try:
        compiled = cachesvc_client.compile(model, (example(),), name=name, publish=False, require_hit=False)
    except Exception as exc:  # noqa: BLE001 - what the row is about
        return {"raised": f"{type(exc).__name__}: {exc}"[:300]}
    return {"source": compiled.source, "why": compiled.miss_reason, "calls": dict(compiled.calls)}


def restart(deploy: str, rows: list) -> Dict[str, Any]:
    out = {}
    for row in rows:
        if row == "unchanged":
            out[row] = load_row(deploy)
        elif row == "train_restart":
            out[row] = load_row(deploy, mode="train")
        elif row in FILE_ROWS:
            out[row] = load_row(deploy, edits=FILE_ROWS[row])
        elif row in CHANGE_ROWS:
            out[row] = load_row(deploy, change=CHANGE_ROWS[row])
        elif row in CALL_ROWS:
            out[row] = call_row(deploy, CALL_ROWS[row])
        elif row == "grad_fallback":
            out[row] = call_row(deploy, _grad_enabled, require_hit=False)
        else:
            out[row] = {"built_in_train": built_in_train, "squeeze_ends": squeeze_ends, "helper_chain": helper_chain,
                        "attrdict_config": attrdict_config}[row](deploy)
    return out


# -- the proof alone ----------------------------------------------------------------------------------

def _built_proof(deploy: str):
    """The proof of the unedited rows model, and its example's input and eager output."""
    import torch

    from cachesvc_client.one_call import proof

    x = example()
    model = make_rows(modules(deploy))
    with torch.no_grad():
        built = proof.capture(model, (x,), {})
        with proof.environment_reads(built) as names:  # the forward's own reads, as the export records them
            want = model(x)
    return built.with_environment(names).data, x, want


def _holds(data: bytes, model: Any, x: Any) -> Dict[str, Any]:
    import torch

    from cachesvc_client.one_call import proof

    try:
        with torch.no_grad():
            checked = proof.Proof.load(data, model)
            held = checked.holds((x,), {})
            return {"held": held, "why": "" if held else checked.why_not((x,), {})}
    except proof.NoProof as exc:
        return {"held": False, "why": exc.message}


def proof_rows(deploy: str) -> Dict[str, Any]:
    """Every file and process row against the proof alone (the key out of the way): each must be refused."""
    data, x, _ = _built_proof(deploy)
    out = {}
    for row, edits in FILE_ROWS.items():
        out[row] = _holds(data, make_rows(modules(deploy, **edits)), x)
    for row, change in CHANGE_ROWS.items():
        module = modules(deploy)
        model = make_rows(module)
        undo = change(module, model)
        try:
            out[row] = _holds(data, model, x)
        finally:
            if undo:
                undo()
    out["train_restart"] = _holds(data, make_rows(modules(deploy), "train"), x)
    out["unchanged"] = _holds(data, make_rows(modules(deploy)), x)
    return out


# -- random edits --------------------------------------------------------------------------------------

def property_run(deploy: str, examples: int) -> Dict[str, Any]:
    """One proof of the rows model, then ``examples`` restarts drawn by hypothesis, each with a random set
    of edits (the files' values, an environment variable, a monkeypatch, a global hook): the proof must
    refuse every restart whose eager output is not the build's (it may refuse more)."""
    import torch
    from hypothesis import HealthCheck, given, settings, strategies as st

    data, x, want = _built_proof(deploy)
    stats: Dict[str, Any] = {"served": 0, "refused": 0, "violations": []}
    values = {k: st.sampled_from([v, v, v * 2 if isinstance(v, int) else v + 0.25]) for k, v in rows_model.DEFAULTS.items()}

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(edits=st.fixed_dictionaries({}, optional=values), flag=st.booleans(), gelu=st.booleans(),
           hook=st.booleans())
    def restart_once(edits: Dict[str, Any], flag: bool, gelu: bool, hook: bool) -> None:
        module = modules(deploy, **edits)
        live = make_rows(module)
        undo = [CHANGE_ROWS[c](module, live) for c, on in (("env_var", flag), ("monkeypatched_gelu", gelu),
                                                           ("global_hook", hook)) if on]
        try:
            held = _holds(data, live, x)["held"]
            with torch.no_grad():
                same = torch.allclose(live(x), want, rtol=1e-5, atol=1e-6)
        finally:
            for step in reversed(undo):
                step()
        stats["served" if held else "refused"] += 1
        if held and not same:
            stats["violations"].append({"edits": edits, "flag": flag, "gelu": gelu, "hook": hook})

    restart_once()
    return stats


def main(argv: list) -> int:
    verb, deploy, rest = argv[0], argv[1], argv[2:]
    sys.path.insert(0, deploy)
    if verb == "build":
        result = build(deploy)
    elif verb == "restart":
        result = restart(deploy, rest)
    elif verb == "proof":
        result = proof_rows(deploy)
    elif verb == "property":
        result = property_run(deploy, int(rest[0]))
    else:
        print(f"unknown verb {verb!r}: build | restart | property", file=sys.stderr)
        return 2
    print("RESULT " + json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
