"""What the one call's proof costs, against the candidate it replaced and the one it beat (issue 38).

For each model, in fresh processes:

  build    the proof captured (Dynamo's full-graph trace and guards, nothing compiled): what a builder pays
  load     a restarted process: importing Dynamo's guard code (when the model's own imports had not), the
           proof compared and its guard trees rebuilt (``Proof.load``, by phase), then the per-call check
           (``Proof.holds``) as built and with other tree settings (``VARIANTS``: torch's defaults, dict
           tags), and the binding's slot check; eager's ms per step beside them
  retrace  the candidate of a trace at every start: the same Dynamo capture in a fresh process (what each
           restart would pay before its first output to fingerprint the live graph)

    python bench/probes/proof_cost.py --models mlp,gpt2,resnet50 [--device cuda] --out proof-cost.jsonl

One JSON line per model and step; seconds and microseconds, one sample each (the probe is for orders of
magnitude: docs/design.md quotes them).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: other settings of the guard trees (proof/check.py: TREE_CONFIG), timed per call beside the chosen one
VARIANTS = {"torch_defaults": {"skip_nnmodule_hook_guards": True, "use_lamba_guard_for_object_aliasing": True},
            "dict_tags": {"use_recursive_dict_tags_for_guards": True},
            "no_hook_guards_dict_tags": {"skip_nnmodule_hook_guards": True,
                                         "use_recursive_dict_tags_for_guards": True}}


def _model(name: str, device: str):
    sys.path.insert(0, str(REPO))
    from harness.models import build_call

    return build_call(name, device)


def build(name: str, device: str, path: str) -> dict:
    import torch

    from cachesvc_client.one_call import proof

    model, args, kwargs = _model(name, device)
    started = time.perf_counter()
    with torch.no_grad():
        built = proof.capture(model, args, kwargs or {})
    seconds = time.perf_counter() - started
    Path(path).write_bytes(built.data)
    return {"capture_s": seconds, "guards": built.guards, "bytes": len(built.data)}


def load(name: str, device: str, path: str) -> dict:
    import timeit

    import torch

    model, args, kwargs = _model(name, device)
    kwargs = kwargs or {}
    had_dynamo = "torch._dynamo" in sys.modules
    started = time.perf_counter()
    import torch._dynamo.guards  # noqa: F401 - what a restart imports for the proof when the model had not
    imported = time.perf_counter() - started
    from cachesvc_client.one_call import proof
    from cachesvc_client.one_call.binding import Binding

    started = time.perf_counter()
    checked = proof.Proof.load(Path(path).read_bytes(), model)
    out = {"dynamo_imported_by_model": had_dynamo, "import_s": imported, "load_s": time.perf_counter() - started,
           "phases": checked.phases, "guards": checked.guards}
    with torch.no_grad():
        assert checked.holds(args, kwargs)
        n = 2000
        out["holds_us"] = timeit.timeit(lambda: checked.holds(args, kwargs), number=n) / n * 1e6
        binding = Binding(model)
        out["binding_us"] = timeit.timeit(binding.changed, number=n) / n * 1e6
        from cachesvc_client.one_call.proof import check

        for label, change in VARIANTS.items():  # the per-call check with other tree settings
            saved = dict(check.TREE_CONFIG)
            check.TREE_CONFIG.update(change)
            try:
                variant = proof.Proof.load(Path(path).read_bytes(), model)
            finally:
                check.TREE_CONFIG.clear()
                check.TREE_CONFIG.update(saved)
            out[f"holds_us_{label}"] = timeit.timeit(lambda: variant.holds(args, kwargs), number=n) / n * 1e6
        out["eager_ms"] = _step_ms(lambda: model(*args, **kwargs), device)
    return out


def retrace(name: str, device: str) -> dict:
    import torch

    model, args, kwargs = _model(name, device)
    started = time.perf_counter()
    from torch._dynamo import convert_frame
    from torch._dynamo.utils import dynamo_timed, get_metrics_context

    imported = time.perf_counter() - started
    started = time.perf_counter()
    with torch.no_grad(), get_metrics_context(), dynamo_timed("probe"):
        convert_frame.fullgraph_capture(model.__call__, tuple(args), dict(kwargs or {}))
    return {"import_s": imported, "retrace_s": time.perf_counter() - started}


def _step_ms(fn, device: str, steps: int = 50) -> float:
    import torch

    for _ in range(3):
        fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps * 1e3


def _child(step: str, name: str, device: str, path: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, __file__, "--child", step, "--models", name, "--device", device,
                           "--path", path], capture_output=True, text=True, env=env, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return json.loads(lines[-1][len("RESULT "):])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="mlp")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--path", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        step = {"build": lambda: build(args.models, args.device, args.path),
                "load": lambda: load(args.models, args.device, args.path),
                "retrace": lambda: retrace(args.models, args.device)}[args.child]
        print("RESULT " + json.dumps(step()))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = os.path.join(tmp, f"{name}.proof")
            row = {"model": name, "device": args.device}
            for step in ("build", "load", "retrace"):
                row[step] = _child(step, name, args.device, path)
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
