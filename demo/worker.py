"""One simulated container: optionally restore, compile and run once, optionally publish.

Prints one JSON line (prefixed ``RESULT``) with the timings, the inductor
counters and the restore/publish reports. Run it with its own HOME, TMPDIR
and TORCHINDUCTOR_CACHE_DIR, as a restarted container would have.

    python demo/worker.py --model mlp --url http://127.0.0.1:8787 --restore --publish
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

T0 = time.perf_counter()


def _hook(spec: str):
    """Import ``module:function`` (the repo root is on sys.path)."""
    import importlib

    module, _, func = spec.partition(":")
    return getattr(importlib.import_module(module), func)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp")
    p.add_argument("--name", default=None, help="cache key name (default: the model name)")
    p.add_argument("--url", default=os.environ.get("CACHESVC_URL"))
    p.add_argument("--restore", action="store_true")
    p.add_argument("--publish", action="store_true")
    p.add_argument("--mode", default="default", help="torch.compile mode")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--restore-hook", default=None, metavar="MODULE:FUNC",
                   help="call FUNC() instead of the cachesvc restore, before compiling, timed as restore_s "
                        "(benchmarks use it for the alternatives: Mega-Cache, a tarball, a copied cache dir)")
    p.add_argument("--remote-cache", action="store_true",
                   help="use the service as Inductor's live remote cache (cachesvc_client.enable_remote_cache) "
                        "before compiling, timed as restore_s; its counters go under 'remote_cache'")
    p.add_argument("--remote-caches", default=None, metavar="NAMES",
                   help="with --remote-cache: which caches, comma-separated (default: the client's DEFAULT_CACHES)")
    p.add_argument("--linger", action="store_true",
                   help="after printing RESULT, stay alive until stdin closes (a long-running process)")
    p.add_argument("--after-hook", default=None, metavar="MODULE:FUNC",
                   help="call FUNC() after the first call (e.g. save Mega-Cache artifacts); "
                        "its dict goes under 'after'")
    args = p.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from demo.models import build

    from cachesvc_client import CacheClient, shape_signature

    out = {"model": args.model, "pid": os.getpid()}
    client = CacheClient(args.url) if (args.restore or args.publish) else None
    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    model, inputs = build(args.model, args.device)
    name = args.name or args.model
    shape = shape_signature(*inputs)
    tags = {"mode": args.mode}
    if args.restore:
        t = time.perf_counter()
        report = client.restore(name, shape, tags)
        out["restore_s"] = time.perf_counter() - t
        out["restore"] = report.to_dict()
    if args.restore_hook:
        t = time.perf_counter()
        out["restore"] = _hook(args.restore_hook)() or {}
        out["restore_s"] = time.perf_counter() - t
    remote = None
    if args.remote_cache:
        from cachesvc_client import enable_remote_cache, remote_cache

        caches = tuple(args.remote_caches.split(",")) if args.remote_caches else remote_cache.DEFAULT_CACHES
        t = time.perf_counter()
        remote = enable_remote_cache(args.url, caches=caches)
        out["restore_s"] = out.get("restore_s", 0.0) + time.perf_counter() - t
    t = time.perf_counter()
    compiled = torch.compile(model, mode=None if args.mode == "default" else args.mode)
    with torch.no_grad():
        compiled(*inputs)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    out["first_call_s"] = time.perf_counter() - t
    out["ready_s"] = time.perf_counter() - T0  # from the worker's first line to the first result
    from torch._dynamo.utils import counters

    out["counters"] = {k: v for k, v in counters["inductor"].items() if "cache" in k}
    out["counters"].update({k: v for k, v in counters["aot_autograd"].items() if "cache" in k})
    out["counters_all"] = {group: dict(c) for group, c in counters.items() if c}
    out["cache_dir"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if remote is not None:
        from torch._inductor.remote_cache import cache_stats

        out["remote_cache"] = {"enabled": sorted(remote.enabled), "local_only": remote.local_only,
                               "stats": remote.stats(),
                               "inductor": {name: vars(stat) for name, stat in cache_stats._stats.items()}}
    if args.after_hook:
        t = time.perf_counter()
        out["after"] = _hook(args.after_hook)() or {}
        out["after_s"] = time.perf_counter() - t
    if args.publish:
        t = time.perf_counter()
        out["publish"] = client.publish(name, shape, tags).to_dict()
        out["publish_s"] = time.perf_counter() - t
    out["process_s"] = time.perf_counter() - T0
    print("RESULT " + json.dumps(out), flush=True)
    if args.linger:
        sys.stdin.read()


if __name__ == "__main__":
    main()
