"""Why does a warm process still compile Triton kernels? A probe for the GPU runs (docs/journal.md).

    python bench/probes/gpu_probe.py --model encoder6 --mode max-autotune-no-cudagraphs --out probe.json

Runs a cold container, the floor (same container again) and a restarted
container that restores through cachesvc, each with ``hook`` installed
before torch.compile (worker.py's ``--restore-hook``). The hook logs, per
process, every Triton compile (kernel, cache hash, whether Triton's cache
had it), every Inductor autotune-cache check and every runtime benchmark or
coordinate-descent run, so the floor's and the restored process's extra
compiles can be traced to their cause. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

LOG = os.environ.get("PROBE_LOG")


def _log(**row) -> None:
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")


def _wrap(owner, name: str, before) -> None:
    orig = getattr(owner, name, None)
    if orig is None:
        _log(event="missing", what=f"{getattr(owner, '__name__', owner)}.{name}")
        return

    @functools.wraps(orig)
    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return orig(*a, **kw)
        finally:
            try:
                before(a, kw, time.perf_counter() - t)
            except Exception as e:  # noqa: BLE001 - a probe never breaks the run
                _log(event="probe-error", what=name, error=repr(e))

    setattr(owner, name, wrapper)


def _kname(tuner) -> str:
    meta = getattr(tuner, "inductor_meta", {}) or {}
    return meta.get("kernel_name") or getattr(getattr(tuner, "fn", None), "__name__", "?")


def hook() -> dict:
    """Install the loggers (called by worker.py before torch.compile)."""
    import triton.compiler.compiler as tcc
    from torch._inductor.runtime import triton_heuristics as th

    _log(event="env", TRITON_CACHE_DIR=os.environ.get("TRITON_CACHE_DIR"),
         TORCHINDUCTOR_CACHE_DIR=os.environ.get("TORCHINDUCTOR_CACHE_DIR"))

    orig_gcm = tcc.get_cache_manager

    def get_cache_manager(key, *a, **kw):
        mgr = orig_gcm(key, *a, **kw)
        _log(event="triton-cache", hash=key, dir=getattr(mgr, "cache_dir", None),
             present=bool(getattr(mgr, "cache_dir", None) and os.path.isdir(mgr.cache_dir)
                          and os.listdir(mgr.cache_dir)), env_dir=os.environ.get("TRITON_CACHE_DIR"))
        return mgr

    tcc.get_cache_manager = get_cache_manager

    def on_compile(a, kw, dt):
        src = a[0] if a else kw.get("src")
        name = getattr(getattr(src, "fn", None), "__name__", None) or str(src)[:80]
        _log(event="triton.compile", kernel=name, seconds=round(dt, 4),
             constants=str(getattr(src, "constants", ""))[:300], attrs=str(getattr(src, "attrs", ""))[:200])

    import triton

    _wrap(tcc, "compile", on_compile)
    triton.compile = tcc.compile
    CA = th.CachingAutotuner
    _wrap(CA, "_precompile_config", lambda a, kw, dt: _log(
        event="precompile_config", kernel=_kname(a[0]), config=str(a[1] if len(a) > 1 else kw), seconds=round(dt, 4)))
    _wrap(CA, "recheck_autotune_cache", lambda a, kw, dt: _log(
        event="recheck_autotune_cache", kernel=_kname(a[0]), info=getattr(a[0], "autotune_cache_info", None),
        configs=[str(r.config) for r in getattr(a[0], "compile_results", [])], seconds=round(dt, 4)))
    _wrap(CA, "benchmark_all_configs", lambda a, kw, dt: _log(
        event="benchmark_all_configs", kernel=_kname(a[0]), n=len(getattr(a[0], "launchers", []) or []),
        seconds=round(dt, 4)))
    _wrap(CA, "coordinate_descent_tuning", lambda a, kw, dt: _log(
        event="coordinate_descent_tuning", kernel=_kname(a[0]), seconds=round(dt, 4),
        start=str(getattr(a[1], "config", None)) if len(a) > 1 else None,
        start_found_by_coordesc=getattr(getattr(a[1], "config", None), "found_by_coordesc", None) if len(a) > 1 else None))
    from torch._inductor.runtime import autotune_cache as ac

    orig_load = getattr(ac, "_load_cached_autotuning", None)
    if orig_load is not None:
        def _load_cached_autotuning(best_config, configs_hash, configs, inductor_meta):
            given = dict(best_config) if isinstance(best_config, dict) else best_config
            out = orig_load(best_config, configs_hash, configs, inductor_meta)
            _log(event="load_cached_autotuning", cached=given, wanted_hash=configs_hash, n_configs=len(configs),
                 configs=[str(c) for c in configs][:8], returned=str(out),
                 returned_found_by_coordesc=getattr(out, "found_by_coordesc", None))
            return out
        ac._load_cached_autotuning = _load_cached_autotuning
    else:
        _log(event="missing", what="autotune_cache._load_cached_autotuning")
    _wrap(CA, "autotune_to_one_config", lambda a, kw, dt: _log(
        event="autotune_to_one_config", kernel=_kname(a[0]), info=getattr(a[0], "autotune_cache_info", None),
        seconds=round(dt, 4)))
    _wrap(CA, "precompile", lambda a, kw, dt: _log(
        event="precompile", kernel=_kname(a[0]), n=len(getattr(a[0], "compile_results", []) or []),
        info=getattr(a[0], "autotune_cache_info", None), seconds=round(dt, 4)))
    return {"probe": LOG}


def _read(path: Path) -> list:
    return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []


def main(argv=None) -> None:
    from harness.containers import Container
    from harness.service import ServiceProcess

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="encoder6")
    p.add_argument("--mode", default="max-autotune-no-cudagraphs")
    p.add_argument("--work", default="/tmp/gpu-probe")
    p.add_argument("--out", required=True)
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for every worker (a fix to try)")
    p.add_argument("--warm-env", action="append", default=["TORCHINDUCTOR_COMPILE_THREADS=1"],
                   help="KEY=VALUE for the floor and restored workers only (default: compile in-process, "
                        "so the hook sees every Triton compile)")
    args = p.parse_args(argv)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    extra = dict(kv.split("=", 1) for kv in args.env)
    warm_env = dict(kv.split("=", 1) for kv in args.warm_env)
    wargs = ("--model", args.model, "--mode", args.mode, "--device", "cuda", "--restore-hook", "bench.probes.gpu_probe:hook")
    result = {"model": args.model, "mode": args.mode, "env": extra, "runs": {}}
    with ServiceProcess(work / "svc") as svc:
        ctr = Container(work / "host")
        for stage in ("cold", "floor", "restored"):
            log = work / f"{stage}.jsonl"
            if stage == "restored":
                ctr.restart(keep=True)
            before = ctr.artifacts()
            flags = ("--publish",) if stage == "cold" else ("--restore",) if stage == "restored" else ()
            env = {**extra, **(warm_env if stage != "cold" else {})}
            r = ctr.run_worker(*wargs, *flags, PROBE_LOG=str(log), **svc.client_env(), **env)
            new = sorted(ctr.artifacts() - before)
            events = _read(log)
            result["runs"][stage] = {
                "first_call_s": r["first_call_s"], "restore": r.get("restore"),
                "counters": r["counters_all"].get("inductor", {}), "new_files": len(new),
                "new_files_sample": new[:40], "events": events}
            print(f"{stage:9} first call {r['first_call_s']:.1f} s, {len(new)} new files, "
                  f"{sum(e['event'] == 'triton.compile' for e in events)} triton.compile calls "
                  f"({sum(e['event'] == 'triton.compile' and e['seconds'] > 0.05 for e in events)} slow), "
                  f"{sum(e['event'] == 'coordinate_descent_tuning' for e in events)} coordesc, "
                  f"{sum(e['event'] == 'benchmark_all_configs' for e in events)} benchmark_all_configs", flush=True)
        result["best_configs"] = {str(f.relative_to(ctr.root)): json.loads(f.read_text())
                                  for f in ctr.root.rglob("*.best_config")}
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
