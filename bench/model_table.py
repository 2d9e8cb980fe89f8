"""The one call across a model table: the route a restart took, its first output against eager's, its steady
state against torch.compile's, for every model x dtype x mode, in fresh containers.

    python bench/model_table.py                                   # the CPU table (small configs, ~15 min)
    python bench/model_table.py --device cuda --models bert-large,gpt2-large,roberta-large,opt-large,vit-large \
        --dtypes fp32,bf16,fp16 --out bench/results/gpu/model-table.json   # the H200 table (bench/README.md)

Models are harness/models.py's names: transformers' families (harness/hf_models.py: built from configs with
random weights, called with keyword arguments) and the torchvision ones where torchvision imports.
Each row is four containers, each with its own empty HOME, TMPDIR and cache dir:

  seed      the one call on a miss: torch.compile, then the package built, checked and published
  floor     the seed's container again with plain torch.compile (it inherits Inductor's cache):
            torch.compile's steady ms per step
  eager     no compile: the baseline of the first output (process start to first output)
  restart   a fresh container through the one call: what served it (the package or torch.compile,
            and why), its first output and steady ms per step

Reported side by side: restart's ready / eager's ready ("x eager"), restart's ms per step / the floor's
("x torch.compile"), the seed's package build seconds and the package's size. One sample per row (the
CPU is shared; run it again for another sample).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import log, service, service_source, workdir, write_json  # noqa: E402
from harness.containers import REPO, Container  # noqa: E402

MODELS = "bert,gpt2,roberta,distilbert,opt,llama,t5,vit"
#: what every row's containers get besides their own folders: ``--transformers-path`` puts that folder first on
#: their PYTHONPATH (another transformers, e.g. 4.57 beside the venv's 5.x: ``pip install --target``)
WORKER_ENV: Dict[str, str] = {}
#: ``--ab-env K=V``: a third container each repeat, the restart again with these variables (an A/B in one run)
AB_ENV: Dict[str, str] = {}
#: ``--profile DIR``: each restart's compile() profiled (cProfile, harness/worker.py), one text file a restart
PROFILE_DIR: Optional[Path] = None
DTYPE_SUFFIX = {"fp32": "", "bf16": "-bf16", "fp16": "-fp16"}


def row_model(model: str, dtype: str) -> str:
    """harness/models.py's name of ``model`` in ``dtype`` (transformers' models take a dtype suffix)."""
    if dtype not in DTYPE_SUFFIX:
        raise SystemExit(f"unknown dtype {dtype!r}: use {', '.join(DTYPE_SUFFIX)}")
    return model + DTYPE_SUFFIX[dtype]


def declared(seq: str) -> List[str]:
    """A row's declared range (``seq=MIN:MAX``, or empty) as the worker's flags: one ``Dim`` on the sequence."""
    return ["--declare-seq", seq.partition("=")[2]] if seq else []


def row_stem(model: str, mode: str, seq: str = "") -> str:
    """A row's name in its containers' folders."""
    return f"{model}-{mode}" + (f"-seq{seq.partition('=')[2].replace(':', '-')}" if seq else "")


def run_seed(work: Path, svc, model: str, mode: str, device: str, seq: str = "") -> Dict:
    """The row's seed container: the one call on a miss (torch.compile, the package built and published)."""
    seed_ctr = Container(work / "containers", f"seed-{row_stem(model, mode, seq)}")
    return seed_ctr.run_worker("--model", model, "--mode", mode, "--device", device, *declared(seq), "--one-call",
                               "--publish", timeout=1800, **svc.client_env(), **WORKER_ENV)


def _pairs(work: Path, svc, stem: str, timed: List[str], repeats: int) -> Tuple[Dict, Dict, Dict]:
    """Eager and the restart, ``repeats`` times each, alternating, each in a fresh container: (the median eager
    sample, the median restart sample, every sample's first output and first call). One sample of a GPU row
    moved by up to 0.4x between runs (the model's build before the first call varies by seconds)."""
    eagers, restarts, variants = [], [], []
    for i in range(repeats):
        suffix = f"-{i}" if repeats > 1 else ""
        eagers.append(Container(work / "containers", f"eager-{stem}{suffix}").run_worker(*timed, "--eager",
                                                                                         **WORKER_ENV))
        profiled = ["--profile-compile", str(PROFILE_DIR / f"compile-{stem}{suffix}.txt")] if PROFILE_DIR else []
        restarts.append(Container(work / "containers", f"restart-{stem}{suffix}").run_worker(
            *timed, "--one-call", *profiled, **svc.client_env(), **WORKER_ENV))
        if AB_ENV:
            variants.append(Container(work / "containers", f"restart-ab-{stem}{suffix}").run_worker(
                *timed, "--one-call", **svc.client_env(), **WORKER_ENV, **AB_ENV))
    routes = {r["compile"]["source"] for r in restarts}
    if len(routes) > 1:
        raise RuntimeError(f"the restarts of {stem} were not all served alike: {sorted(routes)}")
    samples = {"eager_ready_s": [e["ready_s"] for e in eagers], "restart_ready_s": [r["ready_s"] for r in restarts],
               "eager_first_call_s": [e["first_call_s"] for e in eagers],
               "restart_first_call_s": [r["first_call_s"] for r in restarts]}
    if variants:  # the same restart with --ab-env: its first outputs and compile()'s phases, beside the others
        samples.update(ab_env=AB_ENV, ab_ready_s=[v["ready_s"] for v in variants],
                       ab_first_call_s=[v["first_call_s"] for v in variants],
                       ab_phases=[v["compile"].get("phases") for v in variants],
                       restart_phases=[r["compile"].get("phases") for r in restarts],
                       ab_step_ms=[v.get("step_ms") for v in variants], restart_step_ms=[r.get("step_ms") for r in restarts],
                       ab_walks_slots=[v["compile"].get("walks_slots") for v in variants],
                       restart_walks_slots=[r["compile"].get("walks_slots") for r in restarts])
    return _median_run(eagers), _median_run(restarts), samples


def _median_run(runs: List[Dict]) -> Dict:
    """The run whose first output is the median (the lower one of an even count)."""
    return sorted(runs, key=lambda r: r["ready_s"])[(len(runs) - 1) // 2]


def run_row(work: Path, svc, model: str, mode: str, device: str, steps: int, seed: Optional[Dict] = None,
            repeats: int = 1, seq: str = "") -> Dict:
    """The containers of one row (the seed's already run when ``seed`` is given); returns their results and
    the ratios, eager's and the restart's the median of ``repeats`` samples each. ``seq`` (``seq=MIN:MAX``)
    declares a sequence range to the one call (eager and the floor run the example's length alike)."""
    flags = ["--model", model, "--mode", mode, "--device", device, *declared(seq)]
    timed = [*flags, "--steps", str(steps)]
    stem = row_stem(model, mode, seq)
    seed_ctr = Container(work / "containers", f"seed-{stem}")
    if seed is None:
        seed = run_seed(work, svc, model, mode, device, seq)
    os.sync()  # the seed's writes flushed now, not in the middle of the next container's start
    floor = seed_ctr.run_worker(*timed, **WORKER_ENV)
    eager, restart, samples = _pairs(work, svc, stem, timed, repeats)
    artifact = (seed.get("publish") or {}).get("artifact") or {}
    row = {"model": model, "mode": mode, "device": device, **({"declared": seq} if seq else {}),
           "route": restart["compile"]["source"], "why": restart["compile"].get("miss_reason", ""),
           "output_type": restart.get("output_type"), "max_abs_diff": restart["max_abs_diff"],
           "eager_ready_s": eager["ready_s"], "restart_ready_s": restart["ready_s"],
           "restart_first_call_s": restart["first_call_s"], "x_eager": restart["ready_s"] / eager["ready_s"],
           # the calls alone, compile() inside the restart's: the part of the first output the one call changes
           # (a GPU model's build before it varied 5.1-8.8 s between fresh processes: bench/probes/first_run_probe.py)
           "eager_first_call_s": eager["first_call_s"],
           "compiled_step_ms": floor["step_ms"], "restart_step_ms": restart["step_ms"],
           "eager_step_ms": eager["step_ms"], "x_compiled": restart["step_ms"] / floor["step_ms"],
           "seed_first_call_s": seed["first_call_s"], "build_s": artifact.get("build_s"),
           "package_mb": (artifact.get("bytes") or 0) / 1e6 or None, "artifact": artifact.get("status") or artifact,
           "capture_s": restart["compile"].get("capture_s"), "capture_phases": restart["compile"].get("capture_phases"),
           "transformers": restart.get("transformers"), "phases": restart["compile"].get("phases"),
           "proof_phases": restart["compile"].get("proof_phases"), "repeats": repeats, "samples": samples}
    for ctr in work.joinpath("containers").glob(f"*-{stem}*"):
        shutil.rmtree(ctr, ignore_errors=True)
    return row


def _parallel_seeds(work: Path, svc, rows: List[Tuple[str, str, str]], args: argparse.Namespace) -> Dict:
    """Every row's seed, ``--parallel-seeds`` at a time: (model, mode, seq) -> the seed's result or its error.
    Only the seeds overlap (their build seconds then include the others' load); what the table compares
    (eager, the restart, torch.compile's steady state) runs later, one container at a time."""
    def one(row: Tuple[str, str, str]):
        try:
            return run_seed(work, svc, row[0], row[1], args.device, row[2])
        except RuntimeError as exc:
            return exc

    with ThreadPoolExecutor(args.parallel_seeds) as pool:
        return dict(zip(rows, pool.map(one, rows)))


def plan(args: argparse.Namespace) -> List[Tuple[str, str, str]]:
    """The rows to run: (harness model name, mode, declared range or ""), from --rows or the product of
    --models, --dtypes, --modes."""
    if args.rows:
        return [parse_row(spec) for spec in args.rows.split(",")]
    return [(row_model(base, dtype), mode, "") for base in args.models.split(",") for dtype in args.dtypes.split(",")
            for mode in args.modes.split(",")]


def parse_row(spec: str) -> Tuple[str, str, str]:
    """``MODEL[@MODE[@seq=MIN:MAX]]`` -> (model, mode, declared range or "")."""
    model, _, rest = spec.partition("@")
    mode, _, seq = rest.partition("@")
    if seq and not re.fullmatch(r"seq=\d+:\d+", seq):
        raise SystemExit(f"unknown row {spec!r}: a declared range reads seq=MIN:MAX (e.g. llama-large@default@seq=16:256)")
    return model, mode or "default", seq


def markdown(rows: List[Dict]) -> str:
    lines = ["| model | mode | restart ran | eager ready s | restart ready s | x eager | torch.compile ms/step "
             "| restart ms/step | x torch.compile | package build s | package MB |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['mode']} | failed: {r['error'][:120]} | | | | | | | | |")
            continue
        route = "the package" if r["route"] == "artifact" else f"torch.compile ({r['why'][:80]})"
        build = f"{r['build_s']:.1f}" if r.get("build_s") else "-"
        size = f"{r['package_mb']:.1f}" if r.get("package_mb") else "-"
        lines.append(f"| {r['model']} | {r['mode']} | {route} | {r['eager_ready_s']:.2f} | {r['restart_ready_s']:.2f} "
                     f"| **{r['x_eager']:.2f}** | {r['compiled_step_ms']:.2f} | {r['restart_step_ms']:.2f} "
                     f"| **{r['x_compiled']:.2f}** | {build} | {size} |")
    return "\n".join(lines)


def main(argv=None) -> List[Dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=MODELS, help="harness/models.py names, comma-separated")
    p.add_argument("--dtypes", default="fp32,bf16", help="fp32, bf16, fp16 (transformers' models)")
    p.add_argument("--modes", default="default,reduce-overhead", help="torch.compile modes")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--rows", default=None, help="rows in place of models x dtypes x modes: MODEL[-DTYPE]@MODE, "
                                                 "comma-separated (e.g. bert@default,gpt2-bf16@reduce-overhead); "
                                                 "MODEL@MODE@seq=MIN:MAX declares a sequence range to the one call")
    # 200, not 20: a hit starts its snapshot restore once the first output is out, and on a small machine
    # that shares its cores with the service, the calls of the next 0.2-0.7 s wait on it (8-25 ms spikes on
    # the 2-core VM, 2026-12-06); a median of 20 calls measured that window, not the steady state
    p.add_argument("--steps", type=int, default=200, help="calls timed after the first (steady state: their median)")
    p.add_argument("--repeats", type=int, default=1,
                   help="eager and the restart N times each, alternating, fresh containers: the row is their medians")
    p.add_argument("--out", default=None, help="write the JSON here (after every row)")
    p.add_argument("--workdir", default=None, help="scratch folder (default: a temp dir, removed)")
    p.add_argument("--service-ref", default="snapshot", help="snapshot | worktree | a git ref")
    p.add_argument("--parallel-seeds", type=int, default=1,
                   help="run the rows' seeds (compile, build, publish: minutes each) N at a time first, then "
                        "each row's timed containers one after another, alone on the machine")
    p.add_argument("--transformers-path", default=None, metavar="DIR",
                   help="a folder put first on every container's PYTHONPATH: another transformers (pip install "
                        "--target DIR --no-deps transformers==4.57.6 huggingface_hub==0.36.2 tokenizers==0.22.2)")
    p.add_argument("--ab-env", action="append", default=[], metavar="K=V",
                   help="each repeat also runs the restart with these variables, alternating: samples' ab_*")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="profile each restart's compile() (cProfile): DIR/compile-MODEL-MODE[-N].txt, its 60 "
                        "costliest functions by cumulative time (the profiler slows what it measures: not for the table)")
    args = p.parse_args(argv)
    AB_ENV.update(kv.split("=", 1) for kv in args.ab_env)
    global PROFILE_DIR
    if args.profile:
        PROFILE_DIR = Path(args.profile).resolve()
        PROFILE_DIR.mkdir(parents=True, exist_ok=True)
    if args.transformers_path:
        # first, before the rest of the path (where cachesvc_client and the service's wheels may be: the GPU
        # machine's bench/gpu_setup.sh puts them there), not in its place
        WORKER_ENV["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(Path(args.transformers_path).resolve()), str(REPO), os.environ.get("PYTHONPATH")) if p)
    work = workdir(args.workdir, "bench-model-table-")
    svc_env = service_source(args.service_ref, work / "service-src")
    rows: List[Dict] = []
    t0 = time.monotonic()
    try:
        with service(work / "svc", svc_env) as svc:
            seeds = _parallel_seeds(work, svc, plan(args), args) if args.parallel_seeds > 1 else {}
            for model, mode, seq in plan(args):
                try:
                    seed = seeds.get((model, mode, seq))
                    if isinstance(seed, BaseException):
                        raise seed
                    rows.append(run_row(work, svc, model, mode, args.device, args.steps, seed, args.repeats, seq))
                except RuntimeError as exc:  # a worker that failed: the row says so, the table goes on
                    rows.append({"model": model, "mode": mode, "error": " ".join(str(exc).split())[-300:]})
                r = rows[-1]
                log(f"{model:16} {mode:16} {seq} " + (f"failed: {r['error'][:200]}" if "error" in r else
                    f"{r['route']:9} x eager {r['x_eager']:.2f}  x torch.compile {r['x_compiled']:.2f}"))
                if args.out:
                    write_json(Path(args.out), {"section": "model-table", "device": args.device, "rows": rows,
                                                "seconds": time.monotonic() - t0})
        print(markdown(rows))
        return rows
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
