"""One serving process under replayed traffic: how it was started, then each request's latency.

    python harness/replay.py --model mlp --how one-call --requests requests.json [--warm-up] [--twice]

``--how``: ``torch-compile`` (cold, or whatever the container holds), ``mega-cache`` (the key's Mega-Cache
restored and loaded, then torch.compile), ``one-call`` (cachesvc_client.compile). ``--warm-up`` (the one
call): ``model.warm_up()`` before the first request. The requests file is a JSON list of batch sizes; each
request is the model's example input with that batch (or ``[batch, seq]``: an encoder's sequence too), served
one at a time (a synchronizing call on a GPU).
``--twice`` replays the list again in the same process: its steady state. ``--mode``: torch.compile's mode
(reduce-overhead: CUDA graphs on a GPU), for torch.compile and the one call alike. ``--publish-mega-cache``: after the
replay, publish this process's Mega-Cache under the model's name (the seed of the mega-cache variant).

Prints one line, ``RESULT {json}``: the start's seconds (import to ready, warm-up included), each request's
milliseconds, the Dynamo frames compiled during the replay (compiles on the request path) and, for the
one call, its calls and warm-up.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

T0 = time.perf_counter()


def _frames() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["frames"].values()) if "frames" in counters else 0


def request_input(example, request):
    """A request's input from the example's: ``request`` is a batch size, or ``[batch, seq]`` (dim 1 cut or
    tiled to ``seq``: an encoder's sequence)."""
    import torch

    batch, *seq = request if isinstance(request, list) else [request]
    row = example[:1]
    if seq:
        row = row.repeat(1, seq[0] // row.shape[1] + 1, *([1] * (row.dim() - 2)))[:, :seq[0]]
    # a fresh tensor, as a request's collate makes: a view's stride on a dim of size 1 (the row's) is not the
    # contiguous one, and .contiguous() keeps it (the package's guards compare strides)
    return torch.empty((batch, *row.shape[1:]), dtype=row.dtype, device=row.device).copy_(row.expand(batch, *row.shape[1:]))


def _replay(call, inputs, requests, device: str) -> list:
    import torch

    latencies = []
    for request in requests:
        x = request_input(inputs[0], request)
        started = time.perf_counter()
        with torch.no_grad():
            call(x)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        latencies.append((time.perf_counter() - started) * 1000.0)
    return latencies


def _start(args, client, model, inputs, name: str, shape: str):
    import torch

    import cachesvc_client

    out = {}
    if args.how == "one-call":
        call = cachesvc_client.compile(model, inputs, name=name, client=client, publish=False, mode=args.mode)
        if args.warm_up:
            with torch.no_grad():
                out["warmed"] = call.warm_up()
        out["source"] = call.source
        return call, out
    if args.how == "mega-cache":
        out["restore"] = client.restore(name + "-mega", shape, kind="mega-cache", load=True).to_dict()
    return torch.compile(model, mode=args.mode), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp")
    p.add_argument("--name", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--mode", default=None, help="torch.compile's mode (both routes)")
    p.add_argument("--how", choices=["torch-compile", "mega-cache", "one-call"], required=True)
    p.add_argument("--requests", required=True,
                   help="a JSON file: each request's batch size (or [batch, seq]), in order")
    p.add_argument("--warm-up", action="store_true")
    p.add_argument("--twice", action="store_true")
    p.add_argument("--publish-mega-cache", action="store_true")
    args = p.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from harness.models import build

    import torch

    from cachesvc_client import CacheClient, shape_signature

    model, inputs = build(args.model, args.device)
    name = args.name or args.model
    shape = shape_signature(*inputs)
    client = CacheClient()
    call, out = _start(args, client, model, inputs, name, shape)
    with open(args.requests) as f:
        requests = json.load(f)
    if args.how != "one-call":  # torch.compile compiles at its first call: that is the start's, as eager's is
        with torch.no_grad():
            call(*inputs)
    out["ready_s"] = time.perf_counter() - T0
    before = _frames()
    out["latencies_ms"] = _replay(call, inputs, requests, args.device)
    out["request_path_frames"] = _frames() - before
    if args.twice:
        out["steady_ms"] = _replay(call, inputs, requests, args.device)
    if args.how == "one-call":
        out["calls"] = dict(call.calls)
        out["learned"] = call.learned
        out["usage"] = call.usage  # what it reports to the service (the build job's demand)
        out["fell_back"] = list(call.calls.causes)  # why calls went to torch.compile, each cause once
    if args.publish_mega_cache:
        out["published"] = client.publish_mega_cache(name + "-mega", shape).to_dict()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
