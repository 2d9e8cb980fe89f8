"""A serving replay: the first requests of a restarted process, side by side (issue 41).

    python bench/serving_replay.py [--model mlp] [--requests 1000] [--batches 8,1,4,16,2,32,3,64] [--device cpu]
        [--mode reduce-overhead] [--seed-jobs 8]

A restarted process (a fresh container: own empty HOME, TMPDIR and cache dir) takes ``--requests``
requests one at a time, their batch sizes drawn from a skewed mix (Zipf over ``--batches``, busiest
first: most traffic on a few sizes, a tail), and records each latency. The variants, in one run:

  torch.compile   cold: compiles each new batch size on the request path
  mega-cache      the key's Mega-Cache (saved by a seed that served every size), then torch.compile
  declared        cachesvc_client.compile with only the example's package (CACHESVC_LEARNED_PACKAGES=0)
  learned         cachesvc_client.compile after the fleet learned the sizes: a package per size
                  (published by one-call processes of each size, as a build job would), no warm-up
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
import sys
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import log, percentile, table, workdir, write_json  # noqa: E402
from harness.containers import Container  # noqa: E402
from harness.service import ServiceProcess  # noqa: E402


def skewed(batches: List[int], n: int, seed: int = 0) -> List[int]:
    """``n`` batch sizes, the i-th of ``batches`` drawn with weight 1/(i+1)^1.5 (Zipf-like)."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** 1.5 for i in range(len(batches))]
    return rng.choices(batches, weights=weights, k=n)


def summary(ms: List[float]) -> Dict[str, float]:
    return {"p50": percentile(ms, 50), "p95": percentile(ms, 95), "p99": percentile(ms, 99), "max": max(ms)}


def seed_the_fleet(work: Path, svc: ServiceProcess, args: argparse.Namespace, batches: List[int],
                   requests: Path) -> None:
    """Packages of every batch size (one-call processes of each size publish, ``--seed-jobs`` at a time),
    usage reported as they serve, and a Mega-Cache of a process that served every size."""
    model, where = args.model, _where(args)

    def seed(batch: int) -> dict:
        log(f"seed: the one call with batch {batch} publishes its package")
        return Container(work / "seeds", f"b{batch}").run_worker(
            "--model", f"mlp-b{batch}" if model == "mlp" else model, "--name", model, "--one-call", "--publish",
            "--device", args.device, "--mode", args.mode or "default", timeout=1200, **svc.client_env())

    with ThreadPoolExecutor(max_workers=max(1, args.seed_jobs)) as pool:
        list(pool.map(seed, batches))
    log("seed: torch.compile serves every size once, then publishes its Mega-Cache")
    Container(work / "seeds", "mega").run_script("replay.py", "--model", model, "--how", "torch-compile",
                                                 "--requests", str(requests), "--publish-mega-cache", *where,
                                                 timeout=1800, **svc.client_env())


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
    p.add_argument("--device", default="cpu")
    p.add_argument("--mode", default=None, help="torch.compile's mode for every variant, e.g. reduce-overhead")
    p.add_argument("--seed-jobs", type=int, default=1, help="package builds of the seeds at a time")
    p.add_argument("--workdir", default=None)
    p.add_argument("--out", default="bench/results/benchmarks-serving-replay.json")
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    work = workdir(args.workdir, "serving-replay-")
    requests = work / "requests.json"
    requests.write_text(json.dumps(skewed(batches, args.requests)))
    doc = {"model": args.model, "batches": batches, "requests": args.requests, "device": args.device,
           "mode": args.mode or "default", "variants": {}}
    with ServiceProcess(work / "svc") as svc:
        seed_the_fleet(work, svc, args, batches, requests)
        runs = {
            "torch.compile": variant(work, svc, args, requests, "cold", "torch-compile", "--twice"),
            "mega-cache": variant(work, svc, args, requests, "mega", "mega-cache"),
            "declared": variant(work, svc, args, requests, "declared", "one-call", CACHESVC_LEARNED_PACKAGES="0"),
            "learned": variant(work, svc, args, requests, "learned", "one-call", "--twice"),
            "learned+warm": variant(work, svc, args, requests, "warm", "one-call", "--warm-up", "--twice"),
        }
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
                                 "calls": run.get("calls"), "warmed": run.get("warmed"),
                                 "own_steady": own}
        rows.append([name, round(run["ready_s"], 2), *(round(s[k], 2) for k in ("p50", "p95", "p99", "max")),
                     run["request_path_frames"], round(s["p99"] / steady["p99"], 2),
                     round(s["p99"] / own["p99"], 2) if own else "-"])
    rows.append(["steady state", "-", *(round(steady[k], 2) for k in ("p50", "p95", "p99", "max")), 0, 1.0, "-"])
    doc["variants"]["steady state"] = steady
    return rows


if __name__ == "__main__":
    main()
