"""A serving replay: the first requests of a restarted process, side by side (issue 41).

    python bench/serving_replay.py [--model mlp] [--requests 1000] [--batches 8,1,4,16,2,32,3,64] [--device cpu]
        [--mode reduce-overhead] [--seed-jobs 8]
    python bench/serving_replay.py --model encoder --batches 4,1,2,8,16 --seqs 32,16,64,128,8 --seed-with build

A restarted process (a fresh container: own empty HOME, TMPDIR and cache dir) takes ``--requests``
requests one at a time, their batch sizes drawn from a skewed mix (Zipf over ``--batches``, busiest
first: most traffic on a few sizes, a tail) and, with ``--seqs``, their sequence lengths too (dim 1 of
the encoder's input, drawn the same way on their own), and records each latency.

How the fleet learned the shapes (``--seed-with``):

  packages  a one-call process of each batch size publishes its package (the mlp; what a build job would
            build for that demand)
  build     the loop itself: the example's package published; a fleet process serving the mix with only
            that package (it compiles the rest) reports its usage to the service; then
            ``cachesvc-client build harness.factories:MODEL`` reads the demand and builds what covers it
            (exact shapes or ``Dim`` ranges: its plan says which), as a nightly build job does

The variants, in one run:

  torch.compile   cold: compiles each new batch size on the request path
  mega-cache      the key's Mega-Cache (saved by a seed that served every size), then torch.compile
  declared        cachesvc_client.compile with only the example's package (CACHESVC_LEARNED_PACKAGES=0)
  learned         cachesvc_client.compile after the fleet learned the shapes (above), no warm-up
  learned+warm    the same, with model.warm_up() before the first request
  steady state    the torch.compile process's second pass over the same requests

Reported: P50/P95/P99 of the requests' latencies (ms), the slowest, and the compiles on the request
path (Dynamo frames compiled during the replay); the P99's ratio to steady state's, and for the one
call's variants to its own steady state too (the same process's second pass over the same requests:
the package's kernels are not torch.compile's, so "the tail a restart adds" is measured against them).
``--seed-jobs``: the seeds' package builds run that many at a time (their CPU work: a GPU machine's
cores); the variants always run one at a time, alone.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import log, percentile, table, workdir, write_json  # noqa: E402
from harness.containers import REPO, Container  # noqa: E402
from harness.service import ServiceProcess  # noqa: E402


def skewed(values: List[int], n: int, seed: int = 0) -> List[int]:
    """``n`` draws of ``values``, the i-th drawn with weight 1/(i+1)^1.5 (Zipf-like)."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** 1.5 for i in range(len(values))]
    return rng.choices(values, weights=weights, k=n)


def mix(batches: List[int], seqs: List[int], n: int) -> list:
    """The requests: batch sizes, or ``[batch, seq]`` pairs (each drawn on its own) when ``seqs`` are given."""
    drawn = skewed(batches, n)
    return [[b, s] for b, s in zip(drawn, skewed(seqs, n, seed=1))] if seqs else drawn


def summary(ms: List[float]) -> Dict[str, float]:
    return {"p50": percentile(ms, 50), "p95": percentile(ms, 95), "p99": percentile(ms, 99), "max": max(ms)}


def seed_the_fleet(work: Path, svc: ServiceProcess, args: argparse.Namespace, batches: List[int],
                   requests: Path) -> dict:
    """The fleet's packages (``--seed-with``), then a Mega-Cache of a process that served every shape."""
    seeded = seed_by_building(work, svc, args, requests) if args.seed_with == "build" else \
        seed_by_packages(work, svc, args, batches)
    log("seed: torch.compile serves every shape once, then publishes its Mega-Cache")
    Container(work / "seeds", "mega").run_script("replay.py", "--model", args.model, "--how", "torch-compile",
                                                 "--requests", str(requests), "--publish-mega-cache", *_where(args),
                                                 timeout=1800, **svc.client_env())
    return seeded


def seed_by_packages(work: Path, svc: ServiceProcess, args: argparse.Namespace, batches: List[int]) -> dict:
    """A one-call process per batch size publishes its package (``--seed-jobs`` at a time); usage is reported
    as they serve."""
    def seed(batch: int) -> dict:
        log(f"seed: the one call with batch {batch} publishes its package")
        return Container(work / "seeds", f"b{batch}").run_worker(
            "--model", f"mlp-b{batch}" if args.model == "mlp" else args.model, "--name", args.model, "--one-call",
            "--publish", "--device", args.device, "--mode", args.mode or "default", timeout=1200, **svc.client_env())

    with ThreadPoolExecutor(max_workers=max(1, args.seed_jobs)) as pool:
        list(pool.map(seed, batches))
    return {"how": "a one-call package per batch size", "packages": len(batches)}


def seed_by_building(work: Path, svc: ServiceProcess, args: argparse.Namespace, requests: Path) -> dict:
    """The loop: the example's package, a fleet process that serves the mix and reports its usage, then the
    build job on that demand. Returns the build job's outcome (its plan: exact or ranges, and why)."""
    log("seed: the example's package, published by the one call")
    Container(work / "seeds", "example").run_worker("--model", args.model, "--one-call", "--publish",
                                                    "--device", args.device, "--mode", args.mode or "default",
                                                    timeout=1200, **svc.client_env())
    log("seed: a fleet process serves the mix with the example's package only and reports its usage")
    fleet = Container(work / "seeds", "fleet").run_script("replay.py", "--model", args.model, "--how", "one-call",
                                                          "--requests", str(requests), *_where(args), timeout=3600,
                                                          CACHESVC_LEARNED_PACKAGES="0", **svc.client_env())
    log("seed: the build job reads the demand and builds what covers it")
    ctr = Container(work / "seeds", "build")
    cmd = [sys.executable, "-m", "cachesvc_client.cli", "build", f"harness.factories:{args.model}", "--name",
           args.model, "--max-packages", str(args.max_packages), "--json",
           *(("--mode", args.mode) if args.mode else ())]
    proc = subprocess.run(cmd, env=ctr.env(HARNESS_DEVICE=args.device, **svc.client_env()), cwd=str(REPO),
                          capture_output=True, text=True, timeout=7200)
    if proc.returncode != 0:
        raise RuntimeError(f"the build job failed ({proc.returncode}): {proc.stderr[-3000:]}")
    outcome = json.loads(proc.stdout)
    return {"how": "the build job on the fleet's reported usage", "fleet_usage": fleet.get("usage"),
            "build": outcome}


def _where(args: argparse.Namespace) -> Sequence[str]:
    """The device and mode flags of harness/replay.py."""
    return ("--device", args.device, *(("--mode", args.mode) if args.mode else ()))


def variant(work: Path, svc: ServiceProcess, args: argparse.Namespace, requests: Path, stem: str, how: str,
            *flags: str, **env: str) -> dict:
    log(f"variant {stem}")
    return Container(work / "variants", stem).run_script("replay.py", "--model", args.model, "--how", how,
                                                         "--requests", str(requests), *_where(args), *flags,
                                                         timeout=3600, **svc.client_env(), **env)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--batches", default="8,1,4,16,2,32,3,64", help="the mix's batch sizes, busiest first")
    p.add_argument("--seqs", default=None, help="the mix's sequence lengths, busiest first (an encoder's dim 1)")
    p.add_argument("--seed-with", choices=("packages", "build"), default="packages",
                   help="how the fleet learned the shapes: a package per batch size, or the build job on reported usage")
    p.add_argument("--max-packages", type=int, default=8, help="the build job's --max-packages")
    p.add_argument("--device", default="cpu")
    p.add_argument("--mode", default=None, help="torch.compile's mode for every variant, e.g. reduce-overhead")
    p.add_argument("--seed-jobs", type=int, default=1, help="package builds of the seeds at a time")
    p.add_argument("--workdir", default=None)
    p.add_argument("--out", default="bench/results/benchmarks-serving-replay.json")
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    work = workdir(args.workdir, "serving-replay-")
    requests = work / "requests.json"
    seqs = [int(n) for n in args.seqs.split(",")] if args.seqs else []
    if seqs and args.seed_with != "build":
        raise SystemExit("--seqs needs --seed-with build (a package per batch size cannot serve other lengths)")
    requests.write_text(json.dumps(mix(batches, seqs, args.requests)))
    doc = {"model": args.model, "batches": batches, "seqs": seqs, "requests": args.requests, "device": args.device,
           "mode": args.mode or "default", "variants": {}}
    with ServiceProcess(work / "svc") as svc:
        doc["seeded"] = seed_the_fleet(work, svc, args, batches, requests)
        plan = {
            "torch.compile": ("cold", "torch-compile", ("--twice",), {}),
            "mega-cache": ("mega", "mega-cache", (), {}),
            "declared": ("declared", "one-call", (), {"CACHESVC_LEARNED_PACKAGES": "0"}),
            "learned": ("learned", "one-call", ("--twice",), {}),
            "learned+warm": ("warm", "one-call", ("--warm-up", "--twice"), {}),
        }
        runs = {}
        for name, (stem, how, flags, env) in plan.items():
            runs[name] = variant(work, svc, args, requests, stem, how, *flags, **env)
            # Each variant's raw run as it ends: a run cut short (a device command's limit) keeps what it measured.
            write_json(Path(args.out), {**doc, "partial": runs})
    rows = summarize(runs, doc)
    print(table(["variant", "ready s", "p50 ms", "p95 ms", "p99 ms", "max ms", "compiles", "p99 / steady",
                 "p99 / own steady"], rows))
    write_json(Path(args.out), doc)


def summarize(runs: Dict[str, dict], doc: dict) -> List[list]:
    """Each variant's percentiles into ``doc`` and a table row; steady state is torch.compile's second pass."""
    rows, steady = [], summary(runs["torch.compile"]["steady_ms"])
    for name, run in runs.items():
        s = summary(run["latencies_ms"])
        own = summary(run["steady_ms"]) if run.get("steady_ms") else None
        doc["variants"][name] = {**s, "ready_s": run["ready_s"], "request_path_frames": run["request_path_frames"],
                                 "calls": run.get("calls"), "warmed": run.get("warmed"), "fell_back": run.get("fell_back"),
                                 "own_steady": own, "latencies_ms": [round(x, 4) for x in run["latencies_ms"]]}
        rows.append([name, round(run["ready_s"], 2), *(round(s[k], 2) for k in ("p50", "p95", "p99", "max")),
                     run["request_path_frames"], round(s["p99"] / steady["p99"], 2),
                     round(s["p99"] / own["p99"], 2) if own else "-"])
    rows.append(["steady state", "-", *(round(steady[k], 2) for k in ("p50", "p95", "p99", "max")), 0, 1.0, "-"])
    doc["variants"]["steady state"] = steady
    return rows


if __name__ == "__main__":
    main()
