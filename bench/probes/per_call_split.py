"""Where a served call's microseconds go, beside the package's own run (issue 39: steady state).

For each model: a cold container publishes its package through the one call (a real ``cachesvc serve``),
then a restarted container (empty HOME, TMPDIR and cache dir) is served by it and times, per call, the
whole served call and each part of it: the checks before the run (``Slot.refusal``: the call's structure
``spec.match``, ``grad_wanted``, the proof's guard tree ``Proof.holds``, the weights' ``Binding.changed``),
the runner (the C++ loader's run and the output's rebuild, ``unflatten``), and eager beside them. With
``--tree K=V``, another restart per setting of Dynamo's config for the proof's tree (``check.TREE_CONFIG``),
e.g. ``use_recursive_dict_tags_for_guards=true``.

    python bench/probes/per_call_split.py --models gpt2,bert [--device cuda] [--tree use_recursive_dict_tags_for_guards=true]

One JSON line per model and tree setting; microseconds, the median of 5 repeats of 3,000 calls (300 for eager).
Beside the served check (the pinned trees, the binding's storage pointers: proof/pins.py), the same trees without
pins and the binding's walk of every slot, as the check was before the pins.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def per_call_us(fn, number: int = 3000) -> float:
    return round(statistics.median(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6, 2)


def leaf_kinds(manager) -> dict:
    """The proof's tree's leaf guards by kind (torch's GuardManager API)."""
    kinds: Counter = Counter()

    def walk(node) -> None:
        for guard in node.get_leaf_guards():
            kinds[type(guard).__name__] += 1
        for child in node.get_child_managers():
            walk(child)

    walk(getattr(manager, "root", manager))
    return dict(kinds)


def served(name: str, device: str) -> dict:
    """In the restarted container: the hit, then each part of a served call timed on its own."""
    sys.path.insert(0, str(REPO))
    import torch

    import cachesvc_client
    from cachesvc_client.one_call import spec as spec_mod
    from cachesvc_client.one_call.proof import check
    from harness.models import build_call

    check.TREE_CONFIG.update(json.loads(os.environ.get("PROBE_TREE") or "{}"))
    model, args, kwargs = build_call(name, device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    with torch.no_grad():
        compiled = cachesvc_client.compile(model, args, *([kwargs] if kwargs else []), name=name, publish=False)
        for _ in range(3):  # the first call, then (reduce-overhead) the capture
            compiled(*args, **kwargs)
        slot = compiled._slot
        if slot is None or compiled.calls["artifact"] < 3:
            return {"model": name, "error": f"not served: {compiled.miss_reason or compiled.calls}"}
        _, _, flat = slot.refusal(args, kwargs, model, name)
        runner, raw = slot.runner, slot.runner._loader.run(list(flat))
        unpinned = slot.proof.unpinned()

        def timed(fn, number: int = 3000) -> float:
            return per_call_us(lambda: (fn(), sync()), number)

        return {"model": name, "device": device, "tree": dict(check.TREE_CONFIG), "tensors": len(slot.binding._tensors),
                "guards": slot.proof.guards, "leaf_guards": leaf_kinds(slot.proof._managers[0]),
                "call_us": timed(lambda: compiled(*args, **kwargs)),
                "refusal_us": timed(lambda: slot.refusal(args, kwargs, model, name)),
                "spec_match_us": timed(lambda: slot.spec.match(args, kwargs, model)),
                "grad_wanted_us": timed(lambda: spec_mod.grad_wanted(flat, model)),
                "proof_holds_us": timed(lambda: slot.proof.holds(args, kwargs)),
                "binding_changed_us": timed(lambda: slot.binding.changed(slots=slot.walks_slots)),
                # the check before the proof's trees pinned the tensors (proof/pins.py): unpinned trees, the walk
                "walks_slots": slot.walks_slots,
                "proof_holds_unpinned_us": timed(lambda: unpinned.holds(args, kwargs)),
                "binding_walk_us": timed(slot.binding.changed),
                "runner_us": timed(lambda: runner(*flat)),
                "loader_run_us": timed(lambda: runner._loader.run(list(flat))),
                "unflatten_us": timed(lambda: runner._unflatten(raw, runner._out_spec)),
                "eager_us": timed(lambda: model(*args, **kwargs), 300)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="gpt2,bert")
    p.add_argument("--device", default="cpu")
    p.add_argument("--tree", action="append", default=[], metavar="K=V", help="a Dynamo config for the tree (JSON value)")
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(served(args.child, args.device)), flush=True)
        return
    sys.path.insert(0, str(REPO))
    from harness.containers import Container
    from harness.service import ServiceProcess

    settings = [{}] + [{k: json.loads(v) for k, v in (kv.split("=", 1),)} for kv in args.tree]
    base = Path(tempfile.mkdtemp(prefix="per-call-"))
    with ServiceProcess(base / "svc") as svc:
        for name in args.models.split(","):
            ctr = Container(base / name)
            ctr.run_worker("--model", name, "--device", args.device, "--one-call", "--publish", timeout=1800,
                           **svc.client_env())
            for tree in settings:
                ctr.restart()
                proc = subprocess.run([sys.executable, __file__, "--child", name, "--device", args.device],
                                      env=ctr.env(PROBE_TREE=json.dumps(tree), **svc.client_env()),
                                      capture_output=True, text=True, timeout=900)
                lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
                row = json.loads(lines[-1][7:]) if lines else {"model": name, "error": proc.stderr[-2000:]}
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
