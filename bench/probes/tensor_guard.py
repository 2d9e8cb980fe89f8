"""What torch's guard builder pays for the first tensor guard over a CUDA tensor, in a fresh process (issue 39).

cProfile of a restart's ``compile()`` on an H100 put 0.4-1.6 s in ``GuardBuilder.TENSOR_MATCH``'s own time, whether
it ran twice or 203 times, where the same calls over CPU tensors take milliseconds here: a cost paid once, out of
cProfile's sight (C++ or a wait). This times, each once and again, in the order a proof's load meets them: the
pieces of TENSOR_MATCH on a CPU tensor, then on a CUDA parameter, then on a fake CUDA tensor (the build's
inputs arrive as fakes).

    python bench/probes/tensor_guard.py [--device cuda]

One JSON line per step: its name and seconds.
"""
from __future__ import annotations

import argparse
import json
import time


def _timed(name: str, fn, *args) -> None:
    started = time.perf_counter()
    error = ""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - a probe reports what failed and goes on
        error = f"{type(exc).__name__}: {exc}"[:200]
    print(json.dumps({"step": name, "s": round(time.perf_counter() - started, 6), "error": error}), flush=True)


def _add(root, value, name: str) -> None:
    """GuardManager.add_tensor_match_guard, as TENSOR_MATCH calls it (torch 2.11 and 2.13 signatures)."""
    import torch

    keys = torch._C._dispatch_keys(value)
    sizes, strides = list(value.shape), list(value.stride())
    try:
        root.add_tensor_match_guard(value, sizes, strides, name, [name], None, type(value), keys)
    except TypeError:
        root.add_tensor_match_guard(value, sizes, strides, name, [name], type(value), keys)


def _code_part(value) -> None:
    import torch
    from torch._dynamo.guards import get_tensor_guard_code_part

    get_tensor_guard_code_part(value, "x", list(value.shape), list(value.stride()), type(value),
                               torch._C._dispatch_keys(value))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    started = time.perf_counter()
    import torch
    print(json.dumps({"step": "import torch", "s": round(time.perf_counter() - started, 6), "error": ""}))
    _timed("import torch._dynamo.guards", __import__, "torch._dynamo.guards")
    from torch._C._dynamo.guards import RootGuardManager
    from torch._subclasses.fake_tensor import FakeTensorMode

    cpu = torch.nn.Parameter(torch.randn(64, 64))
    for i in range(2):
        _timed(f"cpu code part {i}", _code_part, cpu)
        _timed(f"cpu add guard {i}", _add, RootGuardManager(), cpu, "cpu")
    if args.device != "cpu":
        _timed("cuda tensor made", lambda: torch.nn.Parameter(torch.randn(64, 64, device=args.device)))
        dev = torch.nn.Parameter(torch.randn(64, 64, device=args.device))
        torch.cuda.synchronize()
        for i in range(3):
            _timed(f"{args.device} dispatch keys {i}", torch._C._dispatch_keys, dev)
            _timed(f"{args.device} code part {i}", _code_part, dev)
            _timed(f"{args.device} add guard {i}", _add, RootGuardManager(), dev, "dev")
        mode = FakeTensorMode()
        with mode:
            fake = torch.empty(2, 16, dtype=torch.int64, device=args.device)
        for i in range(3):
            _timed(f"fake {args.device} code part {i}", _code_part, fake)
            _timed(f"fake {args.device} add guard {i}", _add, RootGuardManager(), fake, "fake")


if __name__ == "__main__":
    main()
