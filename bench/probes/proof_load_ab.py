"""The proof's load with and without one of its parts, in fresh processes, alternating (issue 39).

Captures the model's proof once, then loads it (``Proof.load``, by phase) in a fresh process per sample,
the variants taking turns each round:

  session   as shipped: each class described once per load (portable.session)
  nomemo    portable.session off: a class described again for each guard on it (the code before it)
  nolog     as shipped, torch's structured-trace handler detached first: what formatting the guard tree as
            text costs (torch does it whenever that handler is installed, TORCH_TRACE or not; since
            proof/tracelog.py the load detaches it itself where it writes nothing: as ``session`` then)
  tracelog  proof/tracelog.py off: the guard tree's text made for torch's idle trace handler (the code before it)
  fakes     proof/fakes.py off: torch's unpickling makes a fake-tensor mode per tensor (the code before it)
  nogc      as shipped, the garbage collector off during the load: what its collections cost there
  evalall   proof/templates.py off: torch compiles every guard source's template at each read (the code before it)

Every sample also says how long the collector ran inside the load (``gc_s``, ``gc_full``: process/collector.py).

    python bench/probes/proof_load_ab.py --model llama-large-bf16 --rounds 3 --out proof-load-ab.jsonl

One JSON line per sample; seconds, as the load measured them.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ("nomemo", "session", "nolog", "nogc", "evalall", "tracelog", "fakes")


def child(name: str, device: str, variant: str, path: str) -> dict:
    sys.path.insert(0, str(REPO))
    import torch

    from harness.models import build_call

    model, args, kwargs = build_call(name, device)
    from cachesvc_client.one_call import proof
    from cachesvc_client.one_call.proof import portable

    if variant == "build":
        with torch.no_grad():
            built = proof.capture(model, args, kwargs or {})
        Path(path).write_bytes(built.data)
        return {"guards": built.guards, "bytes": len(built.data)}
    import torch._dynamo.guards  # noqa: F401 - what the model's own imports did before compile() in the table
    if variant == "nomemo":
        portable.session = contextlib.nullcontext
    elif variant == "evalall":
        from cachesvc_client.one_call.proof import templates

        templates.compiled_once = contextlib.nullcontext
    elif variant == "tracelog":
        from cachesvc_client.one_call.proof import tracelog

        tracelog.dropped_records = contextlib.nullcontext
    elif variant == "fakes":
        from cachesvc_client.one_call.proof import fakes

        fakes.one_mode = lambda mode: contextlib.nullcontext()
    elif variant == "nolog":
        from torch._logging._internal import trace_log

        for handler in list(trace_log.handlers):
            trace_log.removeHandler(handler)
    from cachesvc_client.process.collector import CollectorClock

    data = Path(path).read_bytes()
    if variant == "nogc":
        gc.disable()
    started = time.perf_counter()
    with CollectorClock() as collector:
        loaded = proof.Proof.load(data, model)
    return {"load_s": round(time.perf_counter() - started, 4), "gc_s": round(collector.seconds, 4),
            "gc_full": collector.full, "objects": len(gc.get_objects()),
            "phases": {k: round(v, 4) for k, v in loaded.phases.items()}}


def _run(name: str, device: str, variant: str, path: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", variant, "--model", name, "--device", device,
                           "--path", path], capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return json.loads(lines[-1][len("RESULT "):])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-large-bf16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--path", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.model, args.device, args.child, args.path)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.proof")
        rows = [{"model": args.model, "device": args.device, "variant": "build", **_run(args.model, args.device,
                                                                                         "build", path)}]
        for n in range(args.rounds):
            for variant in args.variants.split(","):
                rows.append({"model": args.model, "device": args.device, "variant": variant, "round": n + 1,
                             **_run(args.model, args.device, variant, path)})
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
