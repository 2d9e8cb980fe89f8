"""The AOTInductor route's child processes (build.py, verify.py): build a package, or run one once.

    python -m cachesvc_client.one_call.child build EXPORTED PACKAGE MODE IMPORTS CARRY
    python -m cachesvc_client.one_call.child check PACKAGE GIVEN BACK DEVICE [graph]

``build``: EXPORTED is the program export.py saved (IMPORTS: the comma-separated
modules that define its pytree types, imported first); the weightless
package is built at PACKAGE with the self-contained compiler (CARRY ``carry``:
the tensors the computation makes are left beside it, computed.py), and the last
stdout line says where the seconds went. ``check``:
verify.py runs it before a package is published: GIVEN (torch.save
of {"constants": {fqn: tensor}, "calls": [[tensor]], "imports": [module]}) is
loaded, the package is opened the way a hit opens it, run once per call (each
declared shape), and the outputs are saved to BACK. With ``graph`` the run is captured into a CUDA graph first, on other
values of the constants, which are then put back in place: what is saved is
a replay, so a graph that kept the weights it was captured with fails. A
crash or an error here stops the publish, not the process that asked for it.
"""
from __future__ import annotations

import json
import sys


def capture_on_other_weights(runner, constants: dict, inputs: list) -> None:
    """Make ``runner`` (cuda_graph=True) capture its CUDA graph while every floating constant is halved,
    then put the real values back in place: its later replays must read them. Raises SystemExit when
    the capture failed (the runner would silently run without a graph)."""
    kept = {name: t.clone() for name, t in constants.items()}
    for t in constants.values():
        if t.is_floating_point():
            t.mul_(0.5)
    runner(*inputs)  # a shape's first call runs the package as it is (runner.py)
    runner(*inputs)  # its second captures
    if runner.capture_seconds is None or not runner.cuda_graph:
        raise SystemExit(f"capturing the package's run into a CUDA graph failed: {runner.capture_error}")
    for name, t in constants.items():
        t.copy_(kept[name])


def check(package: str, given: str, back: str, device: str, graph: str = "") -> None:
    import importlib

    import torch
    from torch.utils import _pytree as pytree

    from cachesvc_client.one_call.runner import Runner

    data = torch.load(given, map_location=device)
    constants = data["constants"]
    for module in data.get("imports", ()):  # the output's pytree types (export.py), before the loader reads them
        importlib.import_module(module)
    outputs = []
    with torch.no_grad():
        runner = Runner(package, constants, device, cuda_graph=bool(graph))
        for inputs in data["calls"]:
            if graph:
                capture_on_other_weights(runner, constants, inputs)
            outputs.append([t.cpu() for t in pytree.tree_leaves(runner(*inputs))])
    torch.save(outputs, back)


def main(argv) -> int:
    from cachesvc_client.one_call import build
    from cachesvc_client.errors import CacheClientError

    verb, args = argv[0], argv[1:]
    try:
        if verb == "build":
            exported, package, mode, imports, carry = args
            phases = build.build_here(exported, package, mode or None, [m for m in imports.split(",") if m],
                                      carry=carry == "carry")
            print(json.dumps({"build_phases": phases}))  # the last line: build.build reads it
        elif verb == "check":
            check(*args)
        else:
            print(f"unknown verb {verb!r}: build | check", file=sys.stderr)
            return 2
    except CacheClientError as exc:  # a reason the parent reports (its last line)
        print(exc.message, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
