"""One simulated container: optionally restore, compile and run once, optionally publish.

Prints one JSON line (prefixed ``RESULT``) with the timings, the inductor
counters and the restore/publish reports. ``--restore`` starts the restore
before ``import torch`` (the key needs no torch: ``envfiles``) and waits for
it before the first call; ``restore_s`` is that wait, the part of the restore
the import and model build did not hide. Run it with its own HOME, TMPDIR
and TORCHINDUCTOR_CACHE_DIR, as a restarted container would have.

    python harness/worker.py --model mlp --url http://127.0.0.1:8787 --restore --publish
    python harness/worker.py --model mlp-b4 --name mlp --restore --fallback shape --verify  # another shape
    python harness/worker.py --model mlp --kind mega-cache --restore --publish

``--kind`` picks what --restore and --publish move (cachesvc_client.shared.keys.KINDS):
inductor-dir, the folder snapshot (default); mega-cache, restored with
load_cache_artifacts before compiling and published with
save_cache_artifacts; aot-function / pt2-package, a precompiled artifact:
restored and loaded in place of torch.compile (Dynamo does not run), or on a
miss compiled ahead of time (aot_compile / AOTInductor), then published.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
from typing import Optional

T0 = time.perf_counter()


def _hook(spec: str):
    """Import ``module:function`` (the repo root is on sys.path)."""
    import importlib

    module, _, func = spec.partition(":")
    return getattr(importlib.import_module(module), func)


def _precompiled(kind: str, model, inputs, report, path: str):
    """(callable, how) for a precompiled kind: the restored artifact loaded, else compiled ahead of time into ``path``."""
    import cachesvc_client
    import torch

    if report is not None and report.hit:
        fn = cachesvc_client.load_precompiled(report)
        return (lambda *xs: fn(model, *xs)) if kind == "aot-function" else fn, "loaded"
    if kind == "aot-function":
        fn = cachesvc_client.precompile_function(_forward, (model, *inputs), path)
        return (lambda *xs: fn(model, *xs)), "compiled"
    cachesvc_client.precompile_package(model, inputs, path)
    return torch._inductor.aoti_load_package(path), "compiled"


@contextlib.contextmanager
def _profiled(path):
    """cProfile around the block when ``path`` is set; its costliest functions (cumulative) written there."""
    if not path:
        yield
        return
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(60)
        with open(path, "w") as f:
            f.write(text.getvalue())


def _leaves(result):
    """The tensors of a model's output (a tensor, a tuple, a dict, a transformers ModelOutput), in order."""
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(result) if hasattr(t, "clone")]


def _forward(model, *inputs):
    """What aot-function precompiles: the model is an argument, so its weights stay out of the artifact."""
    return model(*inputs)


def _steps(call, inputs, kwargs, n: int, device: str) -> float:
    """Median milliseconds of one call over ``n`` calls after the first (steady state)."""
    import statistics

    import torch

    times = []
    for _ in range(n):
        t = time.perf_counter()
        call(*inputs, **kwargs)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def _replaced(how: str, model, call, inputs) -> float:
    """Replace every parameter of ``model`` by a 1.5x copy (``how``), call ``call`` again; its distance from eager."""
    import torch

    with torch.no_grad():
        if how == "assign":
            model.load_state_dict({k: v * 1.5 for k, v in model.state_dict().items()}, assign=True)
        for module in model.modules():
            for pname, param in list(module._parameters.items()):
                if how == "data":
                    param.data = param.detach() * 1.5
                elif how == "param":
                    setattr(module, pname, torch.nn.Parameter(param.detach() * 1.5, requires_grad=param.requires_grad))
                elif how == "dict":  # straight into the dict: no registration hook fires
                    module._parameters[pname] = torch.nn.Parameter(param.detach() * 1.5,
                                                                   requires_grad=param.requires_grad)
        return float((call(*inputs) - model(*inputs)).abs().max())


def _walks_slots(call) -> Optional[bool]:
    """Whether the hit's binding walks the model's slots before each call (None: no package serves)."""
    return getattr(getattr(call, "_slot", None), "walks_slots", None)


def _await_threshold(want: int, limit: float = 10.0):
    """Seconds until the oldest generation's threshold is ``want`` again (None: not within ``limit``)."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit:
        if gc.get_threshold()[-1] == want:
            return round(time.perf_counter() - started, 3)
        time.sleep(0.02)
    return None


def _seq_range(text: str) -> dict:
    """``MIN:MAX`` -> the one call's dynamic_shapes: one Dim on the sequence of input_ids and attention_mask."""
    from torch.export import Dim

    low, high = (int(n) for n in text.split(":"))
    seq = Dim("seq", min=low, max=high)
    return {"input_ids": {1: seq}, "attention_mask": {1: seq}}


def _other_lengths(call, model, kwargs: dict, lengths: list, device: str) -> dict:
    """Call ``call`` at each sequence length (input_ids and attention_mask cut or tiled to it): its seconds, what
    served it (the one call's counters, when ``call`` has them) and its largest difference from eager's."""
    import torch

    out = {}
    for n in lengths:
        ids, mask = (kwargs[k].repeat(1, n // kwargs[k].shape[1] + 1)[:, :n].contiguous()
                     for k in ("input_ids", "attention_mask"))
        before = dict(getattr(call, "calls", {}))
        with torch.no_grad():
            t = time.perf_counter()
            got = _leaves(call(input_ids=ids, attention_mask=mask))
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t
            want = _leaves(model(input_ids=ids, attention_mask=mask))
        after = dict(getattr(call, "calls", {}))
        served = [k for k in after if after[k] > before.get(k, 0)]
        out[str(n)] = {"seconds": seconds, "served": served,
                       "max_abs_diff": max(float((g.float() - e.float()).abs().max()) for g, e in zip(got, want))}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp")
    p.add_argument("--name", default=None, help="cache key name (default: the model name)")
    p.add_argument("--url", default=os.environ.get("CACHESVC_URL"))
    p.add_argument("--restore", action="store_true",
                   help="restore through cachesvc, started before `import torch` and overlapping it")
    p.add_argument("--restore-after-import", action="store_true",
                   help="with --restore: restore after importing torch and building the model (no overlap)")
    p.add_argument("--publish", action="store_true")
    p.add_argument("--fallback", default="", metavar="STEPS",
                   help="with --restore: fallback steps when the exact key has none, e.g. shape,name")
    p.add_argument("--verify", action="store_true",
                   help="after the first call: client.verify() (did the restore pay off?), reported to the service")
    p.add_argument("--mode", default="default", help="torch.compile mode")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--kind", default="inductor-dir",
                   choices=["inductor-dir", "mega-cache", "aot-function", "pt2-package"],
                   help="what --restore and --publish move (see the module docstring)")
    p.add_argument("--restore-hook", default=None, metavar="MODULE:FUNC",
                   help="call FUNC() instead of the cachesvc restore, before compiling, timed as restore_s "
                        "(benchmarks use it for the alternatives: Mega-Cache, a tarball, a copied cache dir)")
    p.add_argument("--remote-cache", action="store_true",
                   help="use the service as Inductor's live remote cache (cachesvc_client.enable_remote_cache) "
                        "before compiling, timed as restore_s; its counters go under 'remote_cache'")
    p.add_argument("--remote-caches", default=None, metavar="NAMES",
                   help="with --remote-cache: which caches, comma-separated (default: the client's DEFAULT_CACHES)")
    p.add_argument("--one-call", action="store_true",
                   help="cachesvc_client.compile(model, inputs, name=...) in place of torch.compile: loads the "
                        "published precompiled artifact, else compiles (and with --publish publishes after the call)")
    p.add_argument("--no-wait", action="store_true",
                   help="with --one-call --publish: exit right after RESULT, without wait_published() (a short-lived "
                        "process; the publish is finished at exit)")
    p.add_argument("--warm-batch", type=int, default=0, metavar="N",
                   help="with --one-call: before the timed first call, call once with batch N (a builder that "
                        "served another batch size first: its snapshot holds that graph too)")
    p.add_argument("--replace-weights", choices=("assign", "data", "param", "dict"), default=None,
                   help="after the first call, replace every parameter (load_state_dict(assign=True), .data =, or "
                        "a new nn.Parameter) by 1.5x copies, call again and compare with eager")
    p.add_argument("--auto-publish", action="store_true",
                   help="with --one-call: compile(publish=None), the default: publish when the client has a write "
                        "token (at exit when the process does not wait)")
    p.add_argument("--warm-up", action="store_true",
                   help="with --one-call: model.warm_up() before the first call (the learned shapes, once each)")
    p.add_argument("--verify-first", action="store_true", help="with --one-call: compile(..., verify=True)")
    p.add_argument("--require-hit", action="store_true", help="with --one-call: compile(..., require_hit=True)")
    p.add_argument("--profile-compile", default=None, metavar="FILE",
                   help="with --one-call: profile compile(...) (cProfile) and write its 60 costliest functions, by "
                        "cumulative time, to FILE (where the call's own seconds go: bench/model_table.py --profile)")
    p.add_argument("--eager", action="store_true", help="no compile: the model itself (the eager baseline)")
    p.add_argument("--steps", type=int, default=0, help="after the first call: time this many calls (steady state)")
    p.add_argument("--declare-seq", default=None, metavar="MIN:MAX",
                   help="with --one-call, a transformers text model: compile(dynamic_shapes=...) with one Dim on the "
                        "sequence of input_ids and attention_mask, MIN..MAX")
    p.add_argument("--also-seqs", default=None, metavar="L1,L2,...",
                   help="after the first call, call the model at these sequence lengths (a transformers text model): "
                        "each one's seconds, whether the package served it, and its difference from eager")
    p.add_argument("--also-batch", type=int, default=0, metavar="N",
                   help="after the first call, call once more with batch N (another shape) and compare with eager")
    p.add_argument("--scale-weights", type=float, default=None, metavar="F",
                   help="multiply every parameter by F after building the model (same structure, other weights)")
    p.add_argument("--wait-gc-release", action="store_true",
                   help="with --one-call: after the first call, wait (up to 10 s) for compile()'s hold on the full "
                        "collections to end and report when, then (up to 10 s) for the background work the first "
                        "output set off to start, so the report holds its phase")
    p.add_argument("--linger", action="store_true",
                   help="after printing RESULT, stay alive until stdin closes (a long-running process)")
    p.add_argument("--after-hook", default=None, metavar="MODULE:FUNC",
                   help="call FUNC() after the first call (e.g. save Mega-Cache artifacts); "
                        "its dict goes under 'after'")
    args = p.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from harness.models import build_call, signature

    from cachesvc_client import CacheClient, shape_signature

    out = {"model": args.model, "pid": os.getpid()}
    client = CacheClient(args.url) if (args.restore or args.publish or args.verify or args.one_call) else None
    name = args.name or args.model
    tags = {"mode": args.mode}
    early = None
    if args.restore and not args.restore_after_import and not args.fallback and args.kind == "inductor-dir":
        t_early = time.perf_counter()
        early = client.start_restore(name, signature(args.model), tags)  # overlaps import torch + build
    import torch

    model, inputs, kwargs = build_call(args.model, args.device)
    if args.scale_weights is not None:
        with torch.no_grad():
            for param in model.parameters():
                param.mul_(args.scale_weights)
    shape = shape_signature(*inputs, kwargs) if kwargs else shape_signature(*inputs)
    precompiled = args.kind in ("aot-function", "pt2-package")
    report = None
    if args.restore:
        t = time.perf_counter()
        if early is not None and shape == signature(args.model):
            report = early.result()
            out["restore_overlapped_s"] = t - t_early  # import and build time the restore ran alongside
        else:
            report = client.restore(name, shape, tags, fallbacks=[x for x in args.fallback.split(",") if x],
                                    kind=args.kind, load=args.kind == "mega-cache")
        out["restore_s"] = time.perf_counter() - t  # what the restore added before the first call
        out["restore"] = report.to_dict()
    if args.restore_hook:
        t = time.perf_counter()
        out["restore"] = _hook(args.restore_hook)() or {}
        out["restore_s"] = time.perf_counter() - t
    from cachesvc_client import apply_torch_fixes
    from cachesvc_client.onefile import FILENAMES

    out["torch_fixes"] = apply_torch_fixes()  # every run, the floor too: client/process/torch_fixes.py
    artifact = os.path.join(os.environ.get("TMPDIR") or "/tmp", f"worker-{os.getpid()}-{FILENAMES.get(args.kind)}")
    remote = None
    if args.remote_cache:
        from cachesvc_client import enable_remote_cache, remote_cache

        caches = tuple(args.remote_caches.split(",")) if args.remote_caches else remote_cache.DEFAULT_CACHES
        t = time.perf_counter()
        remote = enable_remote_cache(args.url, caches=caches)
        out["restore_s"] = out.get("restore_s", 0.0) + time.perf_counter() - t
    mode = None if args.mode == "default" else args.mode
    with torch.no_grad():
        t = time.perf_counter()
        if args.eager:
            call = model
        elif args.one_call:
            import cachesvc_client

            checked = {"verify": True} if args.verify_first else {}  # only when asked: an older client lacks it
            if args.require_hit:
                checked["require_hit"] = True
            if args.declare_seq:
                checked["dynamic_shapes"] = _seq_range(args.declare_seq)
            # keywords only when the model takes them: an older client's compile() has no kwargs argument
            before_gc = gc.get_threshold()[-1]
            with _profiled(args.profile_compile):
                call = cachesvc_client.compile(model, inputs, *([kwargs] if kwargs else []), name=name, mode=mode,
                                               client=client, publish=True if args.publish else (
                                                   None if args.auto_publish else False), **checked)
            # compile()'s hold on the full collections (process/collector.py): on a hit until just after its first output
            out["gc_oldest_threshold"] = {"before": before_gc, "after_compile": gc.get_threshold()[-1]}
            if args.warm_up:  # before traffic: every learned shape once; what compiles after it is the request path's
                out["warmed"] = call.warm_up()
                from torch._dynamo.utils import counters as dynamo_counters

                out["frames_after_warm_up"] = dict(dynamo_counters["frames"])
            if args.warm_batch:
                call(torch.randn(args.warm_batch, *inputs[0].shape[1:], device=inputs[0].device))
        elif precompiled:
            call, out["precompiled"] = _precompiled(args.kind, model, inputs, report, artifact)
        else:
            call = torch.compile(model, mode=mode)
        result = call(*inputs, **kwargs)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        out["first_call_s"] = time.perf_counter() - t
        if args.one_call:  # reduce-overhead: the package captures its CUDA graph at the second call (runner.py)
            out["captured_by_first_call"] = getattr(call, "capture_seconds", None) is not None
        if "gc_oldest_threshold" in out:
            out["gc_oldest_threshold"]["after_first_call"] = gc.get_threshold()[-1]
            if args.wait_gc_release:  # the hold ends a moment after the first output (one_call/deferred.py)
                out["gc_oldest_threshold"]["released_after_s"] = _await_threshold(out["gc_oldest_threshold"]["before"])
                from cachesvc_client.one_call import deferred

                deferred.wait(call, 10.0)  # it starts a second after the first output, beside the hold's end
        out["ready_s"] = time.perf_counter() - T0  # from the worker's first line to the first result
        # None in a fork server's child (harness/forkserver.py), which starts with them imported: a test that
        # reads what the process imported runs its container cold (Container.run_worker(cold=True))
        out["imported"] = None if getattr(sys, "harness_forked", False) else {
            m: m in sys.modules for m in ("torch._dynamo", "torch._inductor", "triton", "torch._inductor.compile_fx",
                                          "torch._inductor.graph")}
        # reduce-overhead: torch.compile's CUDA graph overwrites its output at the next call
        got = [t.clone() for t in _leaves(result)]
        # eager's reference after the first output: a call before it would warm what the first call pays
        expected = got if args.eager else _leaves(model(*inputs, **kwargs))
        out["step_ms"] = _steps(call, inputs, kwargs, args.steps, args.device) if args.steps else None
    out["max_abs_diff"] = max(float((g.float() - e.float()).abs().max()) for g, e in zip(got, expected))
    if args.also_batch:
        with torch.no_grad():
            other = torch.randn(args.also_batch, *inputs[0].shape[1:], device=inputs[0].device)
            t = time.perf_counter()
            got = call(other)
            out["also_batch_s"] = time.perf_counter() - t  # the off-spec call: torch.compile, cold or from the cache
            out["also_batch_max_abs_diff"] = float((got - model(other)).abs().max())
    if args.also_seqs:
        out["also_seqs"] = _other_lengths(call, model, kwargs, [int(n) for n in args.also_seqs.split(",")], args.device)
    out["output_type"] = type(result).__name__  # a ModelOutput stays one through the one call
    out["transformers"] = getattr(sys.modules.get("transformers"), "__version__", None)
    if args.replace_weights:
        out["walks_slots_before"] = _walks_slots(call)
        out["replaced_max_abs_diff"] = _replaced(args.replace_weights, model, call, inputs)
        out["walks_slots_after"] = _walks_slots(call)
    if args.one_call:
        out["compile"] = {"calls": dict(call.calls), "route": call.route, "source": call.source, "miss_reason": call.miss_reason,
                          "walks_slots": _walks_slots(call),
                          "load_s": call.load_seconds, "proof_s": getattr(call, "proof_seconds", None),
                          "proof_guards": getattr(call, "proof_guards", None), "cuda_graph": call.cuda_graph, "capture_s": call.capture_seconds,
                          "why": getattr(call.calls, "why", None), "causes": getattr(call.calls, "causes", None),
                          "verify_s": getattr(call, "verify_seconds", None),
                          "snapshot_wait_s": getattr(call, "snapshot_wait_seconds", None),
                          "tags": call.tags, "shape": call.shape, "report_warnings": call.report.warnings if call.report else [],
                          "capture_phases": getattr(call, "capture_phases", None),
                          "proof_phases": getattr(call, "proof_phases", None),
                          "usage": getattr(call, "usage", None),  # an older client counts nothing
                          "learned": getattr(call, "learned", None),
                          "phases": getattr(call, "phases", None)}  # where compile()'s seconds went
    from torch._dynamo.utils import counters

    out["counters"] = {k: v for k, v in counters["inductor"].items() if "cache" in k}
    out["counters"].update({k: v for k, v in counters["aot_autograd"].items() if "cache" in k})
    out["counters_all"] = {group: dict(c) for group, c in counters.items() if c}
    out["cache_dir"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if args.verify:
        out["verify"] = client.verify().to_dict()
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
        if args.one_call:
            published = None if args.no_wait else call.wait_published()
            out["publish"] = published
        elif args.kind == "mega-cache":
            published = client.publish_mega_cache(name, shape, tags)
        elif precompiled:
            published = client.publish_precompiled(name, shape, artifact, args.kind, tags, example_inputs=inputs,
                                                   device=args.device)
        else:
            published = client.publish(name, shape, tags)
        out["publish"] = published if args.one_call else published.to_dict()
        out["publish_s"] = time.perf_counter() - t
    out["process_s"] = time.perf_counter() - T0
    print("RESULT " + json.dumps(out), flush=True)
    if args.linger:
        sys.stdin.read()


if __name__ == "__main__":
    main()
