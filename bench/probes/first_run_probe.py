"""Where the first run of a loaded AOTInductor package goes on a GPU (issue 25: efficientnet_b0 in
reduce-overhead spent 3.06 s in its first warm-up run, the capture 0.008 s).

    python bench/probes/first_run_probe.py --model efficientnet_b0 --dir /tmp/probe --out probe.json

Builds the package once as the one call does (export, then the build child with the one call's
options), then runs each probe in a fresh process with its own HOME and TMPDIR:

  eager            the model's first and second eager calls (cuDNN's and cuBLAS's first-use costs included)
  package          the package loaded (the one call's Runner) and its first and second runs
  package-eager    CUDA_MODULE_LOADING=EAGER: every kernel loaded at load time, not at its first launch
  package-warm     cuDNN/cuBLAS warmed first by one eager call, then the package's first run: what is
                   left is the package's own (its kernels' loads)
  package-profile  the first run under torch.profiler: the top CPU-side ops and CUDA API calls
  embed            ``--embed``: a second package built with ``aot_inductor.embed_kernel_binary`` (the
                   kernels' cubins inside the .so, loaded from memory), loaded and run as ``package``

Each probe prints one JSON line; the parent collects them into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PROBES = ("eager", "package", "package-eager", "package-warm", "package-profile")


def _sync_time(fn):
    import torch

    started = time.monotonic()
    out = fn()
    torch.cuda.synchronize()
    return out, time.monotonic() - started


def build_package(model_name: str, folder: Path, mode: str) -> dict:
    from cachesvc_client.one_call import build as build_mod, export as export_mod
    from harness import models

    model, args, kwargs = models.build_call(model_name, "cuda")
    program = folder / "program.pt2"
    started = time.monotonic()
    imports = export_mod.export(model, args, str(program), kwargs=kwargs).imports
    exported = time.monotonic()
    phases = build_mod.build(str(program), str(folder / "package.pt2"), mode=mode, imports=imports)
    names = zipfile.ZipFile(folder / "package.pt2").namelist()
    by_suffix: dict = {}
    for n in names:
        suffix = Path(n).suffix or Path(n).name
        by_suffix[suffix] = by_suffix.get(suffix, 0) + 1
    return {"export_s": exported - started, "build_s": time.monotonic() - exported, "build_phases": phases,
            "package_files": by_suffix, "package_mb": (folder / "package.pt2").stat().st_size / 1e6}


def build_embedded(folder: Path, mode: str) -> dict:
    """The one call's build (build_here) with the kernels' binaries embedded in the wrapper's .so."""
    import torch._inductor.config as inductor_config

    from cachesvc_client.one_call import build as build_mod

    with inductor_config.patch({"aot_inductor.embed_kernel_binary": True}):
        return build_mod.build_here(str(folder / "program.pt2"), str(folder / "package-embed.pt2"), mode)


def probe(kind: str, model_name: str, folder: Path) -> dict:
    t0 = time.monotonic()
    import torch

    from harness import models

    out: dict = {"probe": kind, "import_s": time.monotonic() - t0}
    model, args, kwargs = models.build_call(model_name, "cuda")  # transformers' models: keyword arguments
    torch.cuda.synchronize()
    out["model_s"] = time.monotonic() - t0 - out["import_s"]
    if kind == "eager":
        with torch.no_grad():
            _, out["first_s"] = _sync_time(lambda: model(*args, **kwargs))
            _, out["second_s"] = _sync_time(lambda: model(*args, **kwargs))
        return out
    if kind == "package-warm":
        with torch.no_grad():
            _, out["eager_first_s"] = _sync_time(lambda: model(*args, **kwargs))
    from cachesvc_client.one_call.binding import live_constants
    from cachesvc_client.one_call.calls import leaves
    from cachesvc_client.one_call.runner import Runner

    package = folder / ("package-embed.pt2" if kind == "embed" else "package.pt2")
    runner, out["load_s"] = _sync_time(lambda: Runner(str(package), live_constants(model), "cuda"))
    flat = list(leaves(args, kwargs)[0])  # the package's inputs: positional, then keywords by name
    if kind == "package-profile":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            _, out["first_s"] = _sync_time(lambda: runner(*flat))
        rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:25]
        out["top_self_cpu_ms"] = {e.key: [round(e.self_cpu_time_total / 1e3, 2), e.count] for e in rows}
        rows = sorted(prof.key_averages(), key=lambda e: e.cpu_time_total, reverse=True)[:15]
        out["top_total_cpu_ms"] = {e.key: [round(e.cpu_time_total / 1e3, 2), e.count] for e in rows}
        prof.export_chrome_trace(str(folder / "first-run-trace.json"))
    else:
        _, out["first_s"] = _sync_time(lambda: runner(*flat))
    _, out["second_s"] = _sync_time(lambda: runner(*flat))
    return out


def run_probes(model_name: str, folder: Path, kinds) -> list:
    results = []
    for kind in kinds:
        home = Path(tempfile.mkdtemp(prefix=f"probe-{kind}-", dir=folder))
        env = {**os.environ, "HOME": str(home), "TMPDIR": str(home), "TORCHINDUCTOR_CACHE_DIR": str(home / "ind")}
        if kind == "package-eager":
            env["CUDA_MODULE_LOADING"] = "EAGER"
        started = time.monotonic()
        done = subprocess.run([sys.executable, __file__, "--probe", kind, "--model", model_name, "--dir", str(folder)],
                              capture_output=True, text=True, env=env, timeout=600)
        try:
            row = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            row = {"probe": kind, "error": (done.stderr or done.stdout)[-1500:]}
        row["process_s"] = time.monotonic() - started
        results.append(row)
        print(json.dumps(row), flush=True)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="efficientnet_b0")
    p.add_argument("--mode", default="reduce-overhead")
    p.add_argument("--dir", required=True)
    p.add_argument("--probe", default=None, help="run one probe in this process (the parent's child)")
    p.add_argument("--out", default=None)
    p.add_argument("--embed", action="store_true", help="also build and probe the embedded-kernels package")
    p.add_argument("--build-embedded", action="store_true", help=argparse.SUPPRESS)  # the parent's child
    args = p.parse_args()
    folder = Path(args.dir)
    if args.build_embedded:
        print(json.dumps(build_embedded(folder, args.mode)))
        return
    if args.probe:
        print(json.dumps(probe(args.probe, args.model, folder)))
        return
    folder.mkdir(parents=True, exist_ok=True)
    report = {"model": args.model, "mode": args.mode}
    if not (folder / "package.pt2").exists():
        report["build"] = build_package(args.model, folder, args.mode)
        print(json.dumps(report["build"]), flush=True)
    report["probes"] = run_probes(args.model, folder, PROBES)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    if args.embed:
        started = time.monotonic()
        done = subprocess.run([sys.executable, __file__, "--build-embedded", "--dir", str(folder), "--mode", args.mode],
                              capture_output=True, text=True, timeout=900)
        report["embed_build"] = {"s": time.monotonic() - started, "rc": done.returncode,
                                 "tail": (done.stdout + done.stderr)[-600:]}
        print(json.dumps(report["embed_build"]), flush=True)
        if done.returncode == 0:
            report["probes"] += run_probes(args.model, folder, ("embed",))
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
