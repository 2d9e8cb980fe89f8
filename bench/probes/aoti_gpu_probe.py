"""Why did torch 2.11's AOTInductor loader die on every package on the H200? The probe (its runs: docs/journal.md).

    python bench/probes/aoti_gpu_probe.py --work /tmp/aoti-probe --out probe.jsonl [--gdb]

Builds weightless packages in parallel child processes, as the one call's
builder does, for each model: with Inductor's own compiler (``default``;
the mlp only) and through a compiler wrapper that links the C++ runtime in
(``static``, what client/process/cxx.py does), beside eager's and
torch.compile's ms per step. Then opens and runs each in a fresh child
process the way a hit does: the default build plainly and with the
compiler's libstdc++ preloaded, the static one plainly. Step marks on stderr
name the step a crash died in; faulthandler is on. Each row: rc, seconds per
step, the largest difference from eager, ms per step. With ``--gdb`` the
first variant that dies runs again under cuda-gdb for a native backtrace.
PROBE_DEVICE=cpu runs it here.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# name -> Inductor options (besides package_constants_in_so)
DEVICE = os.environ.get("PROBE_DEVICE", "cuda")
OPTIONS = {"default": {}, "nolayout": {"layout_optimization": False}, "static": {}}  # nolayout: Inductor's layout optimisation off, in case it was the cause
# the "static" build: the wrapper .so carries its own libstdc++ (hidden), not the process's
STATIC_CXX = ('case " $* " in *" -shared "*) exec g++ "$@" -static-libstdc++ -static-libgcc -Wl,--exclude-libs,ALL;; '
              '*) exec g++ "$@";; esac\n')
DIAG = ("g++ --version | head -1; which -a g++ c++ cc; echo CXX=$CXX LD_LIBRARY_PATH=$LD_LIBRARY_PATH; "
        "ls /usr/lib/gcc/x86_64-linux-gnu/; g++ -print-file-name=libstdc++.so.6; "
        "g++ -print-file-name=libstdc++.a; cat /etc/os-release | head -2; "
        "python3 -c 'import torch; print(sorted({l.split()[-1] for l in open(\"/proc/self/maps\") "
        "if \"stdc++\" in l or \"gcc_s\" in l}))'; "
        "for f in $(python3 -c 'import torch; print(\" \".join(sorted({l.split()[-1] for l in open(\"/proc/self/maps\") "
        "if \"stdc++\" in l})))') $(readlink -f $(g++ -print-file-name=libstdc++.so.6)); do "
        "echo $f $(strings $f | grep -E '^GLIBCXX_3\\.4\\.[0-9]+$' | sort -V | tail -1); done")


def _sync(torch) -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _step_ms(torch, fn, inputs, warm: int = 5, steps: int = 30) -> float:
    for _ in range(warm):
        fn(*inputs)
    _sync(torch)
    t = time.perf_counter()
    for _ in range(steps):
        fn(*inputs)
    _sync(torch)
    return (time.perf_counter() - t) / steps * 1e3


def _mark(step: str, t0: float) -> None:
    print(f"MARK {step} {time.perf_counter() - t0:.3f}", file=sys.stderr, flush=True)


def child_build(model_name: str, weights: str, options: str, path: str) -> None:
    t0 = time.perf_counter()
    import torch
    import torch._inductor.config as inductor_config

    from harness.models import build

    model, inputs = build(model_name, DEVICE)
    _mark("model", t0)
    opts = {"aot_inductor.package_constants_in_so": weights == "packaged", **OPTIONS[options]}
    if options == "static":
        cxx = Path(path).parent / f"cxx-{Path(path).stem}" / "g++"  # the name ends in g++: Inductor treats it as gcc
        cxx.parent.mkdir(exist_ok=True)
        cxx.write_text("#!/bin/sh\n" + STATIC_CXX)
        cxx.chmod(0o755)
        opts["cpp.cxx"] = (str(cxx),)
    twin_out = None
    with torch.no_grad():
        twin_out = model(*inputs)
        exported = torch.export.export(model, tuple(inputs))
        _mark("export", t0)
        with inductor_config.patch(opts):
            torch._inductor.aoti_compile_and_package(exported, package_path=path)
    _mark("built", t0)
    torch.save({"inputs": [t.cpu() for t in inputs], "want": twin_out.cpu(),
                "constants": {k: v.detach().cpu() for k, v in {**dict(model.named_parameters()), **dict(model.named_buffers())}.items()}}, path + ".ref")


def child_load(path: str, how: str) -> None:
    """how: live-um (load_constants, user_managed), live-copy (load_constants, copied), packaged, pyload."""
    import faulthandler

    faulthandler.enable()
    t0 = time.perf_counter()
    import torch

    _mark("import-torch", t0)
    ref = torch.load(path + ".ref")
    constants = {k: v.to(DEVICE) for k, v in ref["constants"].items()}
    inputs = [t.to(DEVICE) for t in ref["inputs"]]
    _sync(torch)
    _mark("tensors-on-gpu", t0)
    if how == "pyload":
        import torch._inductor

        fn = torch._inductor.aoti_load_package(path)
        _mark("loader", t0)
        run = fn
    else:
        loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, 0 if DEVICE == "cuda" else -1)
        _mark("loader", t0)
        fqns = list(loader.get_constant_fqns())
        extra = [f for f in fqns if f not in constants]
        unused = [k for k in constants if k not in fqns]
        print(f"INFO fqns={len(fqns)} not-in-model={extra[:5]} not-in-package={unused[:5]} "
              f"meta={dict(loader.get_metadata())}", file=sys.stderr, flush=True)
        if how.startswith("live"):
            loader.load_constants({f: constants[f] for f in fqns}, False, True, how == "live-um")
            _mark("load-constants", t0)

        def run(*xs):
            return loader.run(list(xs))[0]
    with torch.no_grad():
        out = run(*inputs)
        _sync(torch)
        _mark("first-run", t0)
        diff = (out.cpu() - ref["want"]).abs().max().item()
        ms = _step_ms(torch, run, inputs)
    print(f"RESULT {json.dumps({'max_abs_diff': diff, 'step_ms': ms})}", file=sys.stderr, flush=True)


def child_reference(model_name: str) -> None:
    """Eager's and torch.compile's ms per step, for the rows to be compared with."""
    t0 = time.perf_counter()
    import torch

    from harness.models import build

    model, inputs = build(model_name, DEVICE)
    row = {}
    with torch.no_grad():
        for name, fn in (("eager", model), ("compiled", torch.compile(model))):
            fn(*inputs)
            row[f"{name}_step_ms"] = _step_ms(torch, fn, inputs)
            _mark(name, t0)
    print(f"RESULT {json.dumps(row)}", file=sys.stderr, flush=True)


def _run(cmd, timeout: float, env=None, keep: int = 25) -> dict:
    t = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
        rc, err = done.returncode, done.stderr + done.stdout
    except subprocess.TimeoutExpired as exc:
        rc, err = "timeout", (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr)
    marks = {}
    result = info = None
    for line in err.splitlines():
        if line.startswith("MARK "):
            _, step, s = line.split()
            marks[step] = float(s)
        elif line.startswith("RESULT "):
            result = json.loads(line[7:])
        elif line.startswith("INFO "):
            info = line[5:][:1500]
    return {"rc": rc, "s": round(time.perf_counter() - t, 2), "marks": marks, "result": result, "info": info,
            "tail": [ln for ln in err.splitlines() if not ln.startswith(("MARK", "RESULT", "INFO"))][-keep:]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/aoti-probe")
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="mlp,resnet50,vit_b_16")
    ap.add_argument("--gdb", action="store_true")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    me = [sys.executable, str(Path(__file__).resolve())]

    def emit(row):
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")

    grid = [(m, "weightless", o) for m in args.models.split(",") for o in ("default", "static")
            if o == "static" or m == "mlp"]
    emit({"phase": "diag", "out": subprocess.run(DIAG, shell=True, capture_output=True, text=True).stdout})
    preload = subprocess.run("readlink -f $(g++ -print-file-name=libstdc++.so.6)", shell=True,
                             capture_output=True, text=True).stdout.strip()
    pkg = {g: str(work / f"{'-'.join(g)}.pt2") for g in grid}
    models = args.models.split(",")
    with ThreadPoolExecutor(len(grid) + len(models)) as pool:
        refs = [pool.submit(_run, [*me, "--child-reference", m], 420) for m in models]
        built = dict(zip(grid, pool.map(lambda g: _run([*me, "--child-build", *g, pkg[g]], 420), grid)))
        for m, ref in zip(models, refs):
            emit({"phase": "reference", "variant": m, **ref.result()})
    for g, r in built.items():
        emit({"phase": "build", "variant": "-".join(g), **r})
    loads = [(g, how) for g in grid if built[g]["rc"] == 0
             for how in (("live-um", "preload") if g[2] == "default" else ("live-um",))]

    def load(gh):
        env = {**os.environ, "LD_PRELOAD": preload} if gh[1] == "preload" else None
        return _run([*me, "--child-load", pkg[gh[0]], "live-um"], 180, env=env)
    with ThreadPoolExecutor(2) as pool:  # a few at a time: the rows are for diagnosis, not for timing
        done = list(pool.map(load, loads))
    crashed = None
    for (g, how), r in zip(loads, done):
        emit({"phase": "load", "variant": "-".join(g), "how": how, **r})
        if r["rc"] not in (0, "timeout") and crashed is None:
            crashed = (pkg[g], "live-um")
    if args.gdb and crashed:
        gdb = ["cuda-gdb", "-q", "-batch", "-ex", "set pagination off", "-ex", "run", "-ex", "bt 40", "--args", *me, "--child-load", *crashed]
        r = _run(gdb, 240, keep=120)  # the backtrace is in the tail
        emit({"phase": "gdb", "variant": crashed[0], "how": crashed[1], **r})
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child-build":
        child_build(*sys.argv[2:6])
    elif len(sys.argv) > 1 and sys.argv[1] == "--child-reference":
        child_reference(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "--child-load":
        child_load(*sys.argv[2:4])
    else:
        sys.exit(main())
