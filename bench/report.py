"""Make docs/benchmarks.md from bench/results/ (and its charts in docs/img/).

    python bench/report.py              # rewrite docs/benchmarks.md from bench/results/
    python bench/report.py --charts     # and redraw the charts of sections 1 and 2 (needs matplotlib)
    python bench/report.py --check      # exit 1 when docs/benchmarks.md is not what this makes

The page is bench/results/benchmarks.json (bench/run_all.py's sections) rendered here, with the
hand-written sections of bench/sections/ copied in at their places. A ``{{name args}}`` line in a
section file is replaced by a table made from bench/results/ (``PLACEHOLDERS``); every model-table
JSON there (bench/model_table.py's ``--out``) is a row of section 1c (CPU) or 1d (GPU), so a new
run's file dropped into bench/results/ shows after one rerun.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RESULTS = REPO / "bench" / "results"
SECTIONS = Path(__file__).with_name("sections")
PAGE = REPO / "docs" / "benchmarks.md"
IMG = REPO / "docs" / "img"

LABELS = {
    "cold": "cold (compile from nothing)",
    "floor": "floor (inherits everything)",
    "copy-cache-dir": "copy of TORCHINDUCTOR_CACHE_DIR",
    "cachesvc-local": "**cachesvc restore, local backend**",
    "cachesvc-s3": "**cachesvc restore, S3 backend**",
    "cachesvc-local-serial": "cachesvc restore after `import torch` (local)",
    "megacache-s3": "Mega-Cache blob from S3",
    "tarball-s3": "tarball of all roots from S3",
    "redis": "Redis remote FX-graph + AOTAutograd cache",
    "cachesvc-mega": "**Mega-Cache through cachesvc** (kind mega-cache)",
    "cachesvc-aot": "**precompiled function through cachesvc** (kind aot-function)",
    "cachesvc-pt2": "**AOTInductor package through cachesvc** (kind pt2-package)",
    "cachesvc-remote": "**cachesvc live remote cache** (FX graph + AOTAutograd)",
    "caching-precompile": "torch's caching precompile (Dynamo's cache) in a cachesvc snapshot",
    "eager": "eager (no compile)",
    "cachesvc-compile": "**cachesvc_client.compile** (the one call)",
}


def f(x: Optional[float], digits: int = 2) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def md_table(headers: List[str], rows: List[List[str]]) -> str:
    align = ["---"] + ["---:"] * (len(headers) - 1)
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def targets(doc: dict) -> List[dict]:
    """Each target of the benchmark suite with its measured ratio."""
    out = []
    ttfi = doc.get("ttfi")
    if ttfi:
        for r in ttfi["rows"]:
            if r["contender"] in ("cachesvc-local", "cachesvc-s3"):
                out.append({"target": f"TTFI {r['model']}, {r['contender']}: restore + first call <= 1.10 x floor",
                            "ratio": r["x_floor"], "limit": 1.10, "met": r["x_floor"] <= 1.10})
    tr = doc.get("transfer")
    if tr:
        for size in tr["sets"]:
            rows = {r["way"]: r for r in tr["rows"] if r["size"] == size}
            for other in ("boto3-threads", "tarball"):
                ratio = rows["cachesvc"]["seconds"] / rows[other]["seconds"]
                out.append({"target": f"restore {size} set: cachesvc time / {other} time <= 1.00",
                            "ratio": ratio, "limit": 1.0, "met": ratio <= 1.0})
    pub = doc.get("publish")
    if pub:
        second = next(s for s in pub["steps"] if s["step"] == "second")
        out.append({"target": "second publish: uploaded bytes / bytes of the new files <= 1.05",
                    "ratio": second["x_new_bytes"], "limit": 1.05, "met": (second["x_new_bytes"] or 0) <= 1.05})
        same = next(s for s in pub["steps"] if s["step"] == "unchanged")
        out.append({"target": "publish with nothing new uploads 0 bytes", "ratio": float(same["uploaded_bytes"]),
                    "limit": 0.0, "met": same["uploaded_bytes"] == 0})
    svc = doc.get("service")
    if svc:
        for r in svc["rows"]:
            if r["scenario"].startswith("resolve") and _target_rate_row(svc, r):
                out.append({"target": f"{r['scenario']}: p99 < 20 ms at {r['clients']} clients "
                                      f"({svc['entries']:,} entries)", "ratio": r["p99_ms"] / 20.0, "limit": 1.0,
                            "met": r["p99_ms"] < 20.0, "value": f"p99 {r['p99_ms']:.1f} ms"})
    load = doc.get("load")
    if load:
        for r in load["rows"]:
            out.append({"target": f"{r['restores']} concurrent restores of one entry ({r['scenario']}): zero errors",
                        "ratio": float(r["errors"]), "limit": 0.0, "met": r["errors"] == 0,
                        "value": f"{r['errors']} errors, p99 {r['p99_s']:.2f} s"})
    return out


def _target_rate_row(svc: dict, row: dict) -> bool:
    """Whether a service row is the resolve target's: the open loop at the first offered rate (50 clients,
    one resolve a second each). The closed loop and the higher rates show capacity, not the target."""
    rate = svc.get("target_rate", 50.0)
    return rate is not None and row.get("offered_rps", 50.0 if "open loop" in row["scenario"] else None) == rate


def _within_target(svc: dict) -> List[str]:
    """Per storage, the highest offered open-loop rate whose resolve p99 stayed under 20 ms."""
    out = []
    for storage in ("local", "S3"):
        ok = [r["offered_rps"] for r in svc["rows"] if r["scenario"].startswith(f"resolve ({storage}), open loop")
              and "offered_rps" in r and r["p99_ms"] < 20.0]
        out.append(f"{storage}: up to {max(ok):.0f} req/s" if ok else f"{storage}: none of the rates")
    return out


def chart_ttfi(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["ttfi"]["rows"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        rs = [r for r in rows if r["model"] == model]
        names = [r["contender"] for r in rs]
        restore = [r["restore_s"] for r in rs]
        first = [r["first_call_s"] for r in rs]
        colors = ["#2b7bba" if n.startswith("cachesvc") else "#999999" for n in names]
        ax.barh(names, restore, color="#f0a030", label="restore step")
        ax.barh(names, first, left=restore, color=colors, label="first compiled call")
        floor = next((r["total_s"] for r in rs if r["contender"] == "floor"), None)
        if floor:
            ax.axvline(floor * 1.10, color="#c03030", ls="--", lw=1, label="1.10 x floor")
        ax.invert_yaxis()
        ax.set_title(f"{model}: time to first inference (median s)")
        ax.set_xlabel("seconds")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_transfer(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["transfer"]["rows"]
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 3.4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        rs = [r for r in rows if r["size"] == size]
        ax.bar([r["way"] for r in rs], [r["seconds"] for r in rs],
               color=["#2b7bba" if r["way"] == "cachesvc" else "#999999" for r in rs])
        ax.set_title(f"{size} set: {rs[0]['files']} files, {rs[0]['mb']:.0f} MB (median s)")
        ax.set_ylabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _read(results: Path, name: str) -> dict:
    return json.loads((results / name).read_text())


def one_call_gpu_table(results: Path, *names: str) -> str:
    """Section 1b's H200 rows: bench/one_call_rows.py's table of the GPU test's and ttfi's files."""
    from bench import one_call_rows

    return one_call_rows.markdown(one_call_rows.read([str(results / n) for n in names]))


def ttfi_gpu_table(results: Path, *names: str) -> str:
    """Section 7's rows: bench/ttfi.py --device cuda files, one line per contender and file."""
    return gpu_rows([results / n for n in names])


def model_table_files(results: Path, gpu: bool) -> List[Path]:
    """Every model-table JSON under ``results`` (bench/model_table.py's ``--out``: ``section`` is
    ``model-table``, or the section's name), measured on a GPU or on the CPU, by path."""
    out = []
    for path in sorted(results.rglob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("section") in ("model-table", "1c", "1d") and "rows" in doc:
            if (str(doc.get("device", "cpu")).lower() != "cpu") == gpu:
                out.append(path)
    return out


#: transformers' ``-large`` configs (harness/hf_models.py: hidden 768, 12 layers, 12 heads), by the model they match
LARGE_NAMES = {"bert": "BERT-base", "gpt2": "GPT-2", "roberta": "RoBERTa-base", "distilbert": "DistilBERT",
               "opt": "OPT-125M", "llama": "Llama (768 wide)", "vit": "ViT-B"}


def model_label(name: str) -> str:
    """``gpt2-large-bf16`` -> ``GPT-2 (bf16)``; a name that is no ``-large`` config stays as it is."""
    family, large, rest = name.partition("-large")
    if not large or family not in LARGE_NAMES or (rest and not rest.startswith("-")):
        return name
    return f"{LARGE_NAMES[family]} ({rest.lstrip('-') or 'fp32'})"


def _test_row(r: dict) -> dict:
    """A GPU test row (tests/e2e/test_gpu_compile.py's JSON line) as a model-table row."""
    art = r.get("artifact") or {}
    return {"model": r["model"], "mode": r.get("mode", "default"), "route": (r.get("warm_compile") or {}).get("source"),
            "why": (r.get("warm_compile") or {}).get("miss_reason", ""), "eager_ready_s": r["eager_ready_s"],
            "restart_ready_s": r["warm_ready_s"], "x_eager": r["ready_x_eager"], "compiled_step_ms": r["floor_step_ms"],
            "restart_step_ms": r["warm_step_ms"], "x_compiled": r["step_x_compiled"], "build_s": art.get("build_s"),
            "package_mb": (art.get("bytes") or 0) / 1e6 or None}


def model_table(results: Path, where: str) -> str:
    """Section 1c (``cpu``) or 1d (``gpu``): every model-table file's rows, then its GPU test rows."""
    rows = []
    for path in model_table_files(results, where == "gpu"):
        doc = json.loads(path.read_text())
        data = path.relative_to(results).as_posix()
        rows += [(r, "", data) for r in doc["rows"]]
        rows += [(_test_row(r), ", GPU test", data) for r in doc.get("gpu_test_rows", [])]
    out = []
    for r, suffix, data in rows:
        version = r.get("transformers") or ""
        label = model_label(r["model"]) + (f" (transformers {version})" if version.startswith("4.") else "") + suffix
        if r.get("declared"):  # model_table.py's MODEL@MODE@seq=MIN:MAX: a declared range
            label += f", sequence {r['declared'].partition('=')[2].replace(':', '..')} declared"
        if "error" in r:
            out.append([label, r["mode"], "failed: " + r["error"][:120].replace("|", "/")] + [""] * 10 + [data])
            continue
        route = "the package" if r["route"] == "artifact" else f"torch.compile ({(r.get('why') or '')[:80]})"
        out.append([label, r["mode"], route, f(r["eager_ready_s"]), f(r["restart_ready_s"]), f"**{f(r['x_eager'])}**",
                    first_calls(r), call_phases(r.get("phases")), f(r["compiled_step_ms"]), f(r["restart_step_ms"]),
                    f"**{f(r['x_compiled'])}**", f(r.get("build_s"), 1), f(r.get("package_mb"), 1), data])
    return md_table(["model", "mode", "restart ran", "eager ready s", "restart ready s", "x eager",
                     "first call s: eager / restart", "compile() s: key / proof / rest", "torch.compile ms/step", "restart ms/step", "x torch.compile",
                     "package build s", "package MB", "data"], out)


def first_calls(r: dict) -> str:
    """Eager's first call and the restart's (``compile()`` included): the part of the first output the one call
    changes, without the model's build before it; "-" for rows measured before eager's was kept."""
    if r.get("eager_first_call_s") is None or r.get("restart_first_call_s") is None:
        return "-"
    return f"{r['eager_first_call_s']:.2f} / {r['restart_first_call_s']:.2f}"


def call_phases(phases: Optional[dict]) -> str:
    """The restart's ``compile()`` seconds (``model.phases``): its total, then the key's walk, the proof and the
    rest (restore, bind, load, the background start), and the collector's share of them where it was kept; "-"
    for rows measured before the phases were kept."""
    if not phases or "total" not in phases:
        return "-"
    key, proof = phases.get("key", 0.0), phases.get("proof", 0.0)
    gc = f" (gc {phases['gc']:.2f})" if "gc" in phases else ""  # inside the others: rows since it was kept
    return f"{phases['total']:.2f}: {key:.2f} / {proof:.2f} / {phases['total'] - key - proof:.2f}{gc}"


def fleet_table(results: Path, name: str) -> str:
    """Section 6b: bench/fleet.py's rows."""
    doc = _read(results, name)

    def service_p99(r: dict) -> str:
        p99 = (r.get("service_p99_s") or {}).get("resolve.resolve")
        return f"<= {p99:.1f} s" if p99 is not None else "-"

    return md_table(["scenario", "restores", "errors", "wall s", "restores/s", "restore p50 s", "restore p99 s",
                     "service resolve p99"],
                    [[r["scenario"], r["restores"], r["errors"], f(r["wall_s"], 1), f(r["restores_per_s"], 1),
                      f(r["p50_s"]), f(r["p99_s"]), service_p99(r)] for r in doc["rows"]])


def serving_replay_table(results: Path, name: str) -> str:
    """Section 9: bench/serving_replay.py's variants."""
    doc = _read(results, name)
    steady = doc["variants"]["steady state"]["p99"]
    labels = {"torch.compile": "torch.compile (cold)", "mega-cache": "Mega-Cache, then torch.compile",
              "declared": "one call, declared shape only", "learned": "one call, learned sizes",
              "learned+warm": "one call, learned sizes + `warm_up()`",
              "steady state": "steady state (torch.compile's second pass)"}
    rows = []
    for key, v in doc["variants"].items():
        own = v.get("own_steady")  # the same process's second pass (the one call's variants, runs since 2026-12-04)
        rows.append([labels.get(key, key), f(v.get("ready_s")), f(v["p50"]), f(v["p95"]), f(v["p99"]), f(v["max"]),
                     v.get("request_path_frames", 0), f(v["p99"] / steady), f(v["p99"] / own["p99"]) if own else "-"])
    return md_table(["variant", "ready s", "p50 ms", "p95 ms", "p99 ms", "max ms", "compiles", "p99 / steady",
                     "p99 / own steady"], rows)


def ttfi_eager_table(results: Path, *names: str) -> str:
    """bench/ttfi.py files' rows against eager: process start to first output, and its ratio to eager's."""
    rows = []
    for name in names:
        for r in _read(results, name)["rows"]:
            rows.append([r["model"], LABELS.get(r["contender"], r["contender"]), r["n"], f(r["restore_s"]),
                         f(r["first_call_s"]), f(r.get("ready_s")), f(r.get("x_eager")),
                         f"{r['fxgraph_hits']} / {r['n']}", name])
    return md_table(["model", "contender", "rounds", "restore s", "first call s", "process start to first output s",
                     "x eager", "fx-graph hits / runs", "data"], rows)


#: compile()'s phases (CompiledModel.phases), in the order they run; "gc", the collector's seconds inside them
PHASES = ("key", "restore", "proof", "bind", "load", "snapshot", "background", "total", "gc")


def compile_phases_table(results: Path, *names: str) -> str:
    """The one call's own seconds by phase: the median over a ttfi file's cachesvc-compile samples, per model."""
    from statistics import median

    rows = []
    for name in names:
        doc = _read(results, name)
        for model in doc["models"]:
            runs = [s["compile"] for s in doc["samples"] if s["model"] == model and s["contender"] == "cachesvc-compile"
                    and (s.get("compile") or {}).get("phases")]
            if not runs:
                continue
            got = [p for p in PHASES if any(p in c["phases"] for c in runs)]
            rows.append([model, runs[0]["source"], len(runs)] +
                        [f(median(c["phases"].get(p, 0.0) for c in runs), 3) if p in got else "-" for p in PHASES] +
                        [name])
    return md_table(["model", "served by", "runs"] + [f"{p} s" for p in PHASES] + ["data"], rows)


PLACEHOLDERS: Dict[str, Callable[..., str]] = {
    "one-call-gpu": one_call_gpu_table, "ttfi-gpu": ttfi_gpu_table, "model-table": model_table, "fleet": fleet_table,
    "serving-replay": serving_replay_table, "ttfi-eager": ttfi_eager_table, "compile-phases": compile_phases_table,
}


def section(name: str, results: Path) -> List[str]:
    """bench/sections/<name>.md with each ``{{name args}}`` line made from ``results``; its leading
    comment (what the file is, for whoever edits it) is left out of the page."""
    text = (SECTIONS / f"{name}.md").read_text()
    text = re.sub(r"\A<!--.*?-->\n", "", text, flags=re.S)

    def table_for(m: re.Match) -> str:
        kind, *args = m.group(1).split()
        try:
            return PLACEHOLDERS[kind](results, *args)
        except FileNotFoundError as exc:  # a results folder of one run (run_all.py --out-dir) lacks the others
            return f"*(no data here: {Path(exc.filename).name} is not in {results})*"

    return [re.sub(r"^\{\{([^}]+)\}\}$", table_for, text.strip(), flags=re.M), ""]


def dead_service_section(ds: dict) -> List[str]:
    when = "".join(f", {ds[k]}" if k != "command" else f", `{ds[k]}`" for k in ("measured", "command", "load") if ds.get(k))
    note = f" The rows were {ds['note']}." if ds.get("note") else ""
    return ["## 8. A dead service: time to a miss", "",
            "What a container start pays when the cache is down (bench/dead_service.py): one "
            "`cachesvc-client restore --json` process with default settings per sample, against a loopback "
            "port nothing listens on (*refused*), an address that drops every packet (*unroutable*: "
            "10.255.255.1 in a private network namespace, a veth pair with nobody on the far end) and a "
            "socket that accepts and never answers (*silent*: bounded by `timeout`, 30 s by default). "
            "*process s* includes starting Python and importing the client; *report s* is the restore's "
            f"own `seconds`. Medians of {ds['rounds']} rounds" + (f" ({when[2:]})" if when else "") + "." + note, "",
            md_table(["service", "client", "process s", "report s", "reason (last sample)"],
                     [[r["case"], r["client"], f(r["process_s"]), f(r["report_s"]),
                       r["reason"].replace("|", "/")[:160]] for r in ds["rows"]]), ""]


def render(doc: dict, results: Path = RESULTS, *, charts: bool = False) -> str:
    """The page for ``doc`` (bench/run_all.py's JSON) with the sections of bench/sections/ and the tables
    made from ``results``; with ``charts``, also draws sections 1 and 2's charts into docs/img/."""
    if charts:
        IMG.mkdir(parents=True, exist_ok=True)
    m = doc["machine"]
    parts = ["# Benchmarks", "",
             f"Measured {doc['date']} with `{doc['command']}` ({doc.get('mode', 'full')} run, "
             f"{doc.get('seconds', 0) / 60:.0f} min). Raw numbers: [bench/results/benchmarks.json]"
             "(../bench/results/benchmarks.json); every file this page is made from is in bench/results/ "
             "(`python bench/report.py` makes it again). How each ran, and what was found on the way: "
             "[journal.md](journal.md)."
             + (f" ({doc['merged']}.)" if doc.get("merged") else ""), "",
             "Set-up: `pip install -e '.[bench]'`, `apt-get install wrk` (optional), PostgreSQL and Redis on "
             "127.0.0.1 (bench/README.md). `python bench/run_all.py --quick` is a one-round check (~5 min).", "",
             md_table(["machine", ""], [["CPU", m["cpu"]], ["cores", m["cores"]], ["memory", m["memory"]],
                                        ["OS", m["os"]], ["Python", m["python"]], ["torch", m["torch"]],
                                        ["boto3", m["boto3"]], ["rclone (S3 on loopback)", m["rclone"]],
                                        ["service code", doc.get("service_source", "working tree")],
                                        ["client code", doc.get("client_source", "working tree")]]), "",
             "Every number is a median over alternating rounds (all contenders of a round run back to back, "
             f"in a {(doc.get('ttfi') or {}).get('order', 'rotated')} order) on a shared 2-core VM; spread "
             "between rounds is in the JSON's samples. "
             "Every contender of section 1 is a fresh simulated container (`harness/containers.py`): its own "
             "empty HOME, TMPDIR and cache dir, at the same paths as the cold container had.", ""]
    tg = targets(doc)
    if tg:
        parts += ["## Targets", "",
                  md_table(["target", "measured ratio", "met"],
                           [[t["target"], t.get("value") or f(t["ratio"], 3), "yes" if t["met"] else "**no**"]
                            for t in tg]), ""]
    if doc.get("ttfi"):
        t = doc["ttfi"]
        if charts:
            chart_ttfi(doc, IMG / "benchmarks-ttfi.png")
        parts += ["## 1. Time to first inference in a fresh container", "",
                  f"Models on the CPU: `{'`, `'.join(t['models'])}` (harness/models.py), torch.compile default mode, "
                  f"{t['repeats']} rounds. *restore* is the step before torch.compile (cachesvc restore, copy, "
                  "download + extract, `load_cache_artifacts`); *first call* is torch.compile plus the first "
                  "forward; *x floor* is their sum over the floor's.", "",
                  "![time to first inference](img/benchmarks-ttfi.png)", ""]
        if any(r["contender"] in ("cachesvc-mega", "cachesvc-aot", "cachesvc-pt2") for r in t["rows"]):
            parts += ["The other version kinds: *cachesvc-mega* restores a kind `mega-cache` version "
                      "and loads it with `load_cache_artifacts` in its restore step, then runs torch.compile; "
                      "*cachesvc-aot* and *cachesvc-pt2* fetch a precompiled artifact (`aot-function`: "
                      "`aot_compile` + `save_compiled_function`; `pt2-package`: AOTInductor) in the restore "
                      "step, and their *first call* is `load_precompiled` plus the first forward, with no "
                      "torch.compile and no Dynamo.", ""]
        for model in t["models"]:
            rs = [r for r in t["rows"] if r["model"] == model]
            parts += [f"**{model}**", "",
                      md_table(["contender", "restore s", "first call s", "sum s", "x floor", "speed-up vs cold",
                                "fx-graph hits / runs"],
                               [[LABELS.get(r["contender"], r["contender"]), f(r["restore_s"]), f(r["first_call_s"]),
                                 f(r["total_s"]), f(r["x_floor"]), f(r["speedup_vs_cold"], 1),
                                 f"{r['fxgraph_hits']} / {r['n']}"] for r in rs]), ""]
        seeds = t.get("seeds", {})
        if seeds:
            parts += ["What each store held (seed container):", "",
                      md_table(["model", "cachesvc files", "cachesvc uploaded MB", "tarball MB (.tar.zst)",
                                "Mega-Cache MB", "Redis keys / MB"],
                               [[mdl, s["publish_local"]["files"], f(s["publish_local"]["uploaded_bytes"] / 1e6, 1),
                                 f(s["tarball"]["tar_zst_bytes"] / 1e6, 1), f(s["megacache"].get("bytes", 0) / 1e6, 2),
                                 f"{s['redis']['keys']} / {s['redis']['bytes'] / 1e6:.2f}" if s.get("redis") else "-"]
                                for mdl, s in seeds.items()]),
                      ""]
    parts += section("one-call", results) + section("model-table", results)
    if doc.get("transfer"):
        tr = doc["transfer"]
        if charts:
            chart_transfer(doc, IMG / "benchmarks-transfer.png")
        parts += ["## 2. Restore transfer: same content, three ways", "",
                  "Synthetic caches shaped like Inductor's (bench/synth.py), published once through cachesvc "
                  "(S3 backend) and uploaded as one .tar.zst (zstd level 3, like cachesvc's blobs). "
                  "*cachesvc*: `CacheClient.restore` (resolve, presigned GETs of blobs and of packs of small "
                  "blobs, sha256 check, atomic rename). "
                  "*boto3-threads*: the same stored objects, `get_object` on 16 threads (a packed blob by a "
                  "ranged `get_object` of its pack), zstd-decoded and written, "
                  "no verification, listing given for free. *tarball*: one `get_object`, stream-extracted. "
                  f"{tr['repeats']} rounds"
                  + (f", after {tr['warmup']} untimed warm-up round (the first read of a stored object "
                     "comes from disk, the later ones from the page cache)" if tr.get("warmup") else "") + ".", "",
                  "![restore transfer](img/benchmarks-transfer.png)", "",
                  md_table(["set", "way", "files", "MB", "median s", "files/s", "MB/s", "time / cachesvc"],
                           [[r["size"], r["way"], r["files"], f(r["mb"], 0), f(r["seconds"], 3),
                             f(r["files_per_s"], 0), f(r["mb_per_s"], 0), f(r["x_cachesvc"])] for r in tr["rows"]]),
                  ""]
    if doc.get("publish"):
        pub = doc["publish"]
        parts += ["## 3. Publish", "",
                  "One container compiles the mlp at batch 8 (cold), publishes; compiles batch 16 (a new key) and "
                  "publishes; publishes batch 16 again with nothing new. S3 backend. *new files* are files whose "
                  "sha256 the service had not seen; uploads are zstd-compressed where that saves 10 %.", "",
                  md_table(["publish", "key", "status", "uploaded blobs", "uploaded MB", "seconds", "new files",
                            "new MB (raw)", "new MB (zstd)", "uploaded / new raw", "uploaded / new zstd"],
                           [[s["step"], s["model"], s["status"], s["uploaded_blobs"], f(s["uploaded_bytes"] / 1e6, 3),
                             f(s["seconds"]), s["new_files"], f(s["new_bytes"] / 1e6, 3),
                             f(s["new_bytes_zstd"] / 1e6, 3), f(s["x_new_bytes"], 3), f(s["x_new_zstd"], 3)]
                            for s in pub["steps"]]), ""]
        st = pub["storage"]
        parts += ["## 4. Storage for shape variants", "",
                  f"{st['variants']} batch sizes of the mlp, each its own key, all published from one container.", "",
                  md_table(["", "MB"],
                           [["stored by cachesvc (S3 objects)", f(st["stored_bytes"] / 1e6, 1)],
                            ["sum of unique file bytes (by sha256)", f(st["unique_file_bytes"] / 1e6, 1)],
                            ["sum of every version's bytes (no dedup)", f(st["sum_version_bytes"] / 1e6, 1)],
                            ["one .tar.zst per key", f(st["tarball_per_key_bytes"] / 1e6, 1)]]), "",
                  f"Stored / unique = {st['x_unique']:.3f}; stored / sum of versions = {st['x_sum_versions']:.3f}.", ""]
    if doc.get("service"):
        svc = doc["service"]
        parts += ["## 5. Service latency", "",
                  f"`cachesvc serve` (gunicorn, default 2 workers x 8 threads) on PostgreSQL with "
                  f"{svc['entries']:,} entries (one committed version of {svc['files_per_version']} files each). "
                  "Closed loop: `wrk`, 50 connections back to back on the same 2 cores as the service and "
                  "PostgreSQL: it measures capacity (requests/s), and its latency is queueing (50 connections / "
                  "requests/s). Open loop: 50 Python client threads send a fixed number of requests/s on a "
                  "schedule, latency from the scheduled send. The target is the open loop at "
                  f"{svc.get('target_rate') or 50:.0f} requests/s (50 clients resolving once a second each); "
                  "the higher rates find where p99 leaves 20 ms ("
                  + "; ".join(_within_target(svc)) + ").", "",
                  md_table(["scenario", "clients", "requests/s", "p50 ms", "p90 ms", "p99 ms", "max ms", "errors"],
                           [[r["scenario"], r["clients"], f(r["rps"], 0), f(r["p50_ms"], 1), f(r["p90_ms"], 1),
                             f(r["p99_ms"], 1), f(r["max_ms"], 1), r["errors"]] for r in svc["rows"]]), ""]
    if doc.get("load"):
        ld = doc["load"]
        parts += ["## 6. Load: concurrent restores of one popular entry", "",
                  f"`cachesvc serve` (gunicorn, default workers and threads) on PostgreSQL; one entry of "
                  f"{ld['files']} files ({ld['mb']:.0f} MB, one file a third of it); {ld['restores']} restores "
                  f"released at once from {ld['procs']} client processes (threads), each a fresh CacheClient into "
                  "an empty cache dir, every file checked byte for byte afterwards. A restore's time runs from "
                  "its start to its last file renamed into place; an error is a miss, a failed file, a wrong byte "
                  "or an exception. All on the same 2 cores (bench/load.py).", "",
                  md_table(["storage", "restores", "errors", "wall s", "restores/s", "p50 s", "p90 s", "p99 s",
                            "max s"],
                           [[r["scenario"], r["restores"], r["errors"], f(r["wall_s"]), f(r["restores_per_s"], 1),
                             f(r["p50_s"]), f(r["p90_s"]), f(r["p99_s"]), f(r["max_s"])] for r in ld["rows"]]), ""]
    parts += section("fleet", results) + section("gpu-ttfi", results)
    ds = doc.get("dead_service") or (_read(results, "benchmarks-dead-service.json")
                                     if (results / "benchmarks-dead-service.json").exists() else None)
    if ds:
        parts += dead_service_section(ds)
    parts += section("serving-replay", results) + section("one-call-cost", results)
    if tg:
        parts += ["## Closing note", "",
                  "Measured against the targets:", ""]
        parts += [f"- {t['target']}: **{t.get('value') or f(t['ratio'], 3)}**, {'met' if t['met'] else 'missed'}"
                  for t in tg]
        parts += [""]
    parts += section("notes", results)
    return "\n".join(parts)


def write(results: Path = RESULTS, *, charts: bool = False) -> Path:
    """Rewrite docs/benchmarks.md from ``results`` (and the charts, with ``charts``)."""
    PAGE.write_text(render(_read(results, "benchmarks.json"), results, charts=charts))
    return PAGE


def gpu_rows(paths: List[Path]) -> str:
    """The markdown table of bench/ttfi.py JSON files from the GPU machine (section 7)."""
    rows = []
    for path in paths:
        doc = json.loads(path.read_text())
        for r in doc["rows"]:
            name, _, mode = r["model"].partition("@")
            rows.append([name, mode or "default", LABELS.get(r["contender"], r["contender"]).replace("**", ""),
                         r["n"], f(r["restore_s"]), f(r["first_call_s"]), f(r["total_s"]), f(r["x_floor"]),
                         f(r["speedup_vs_cold"], 1), f(r.get("ready_s")), f"{r['fxgraph_hits']} / {r['n']}",
                         path.name])
    return md_table(["model", "mode", "contender", "rounds", "restore s", "first call s", "sum s", "x floor",
                     "speed-up vs cold", "process start to first output s", "fx-graph hits / runs", "data"], rows)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(RESULTS), help="the results folder (default bench/results/)")
    ap.add_argument("--charts", action="store_true", help="redraw the charts of sections 1 and 2 (matplotlib)")
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/benchmarks.md is not what this makes")
    ap.add_argument("--gpu-rows", nargs="+", metavar="JSON", help="print the table of bench/ttfi.py GPU files")
    args = ap.parse_args(argv)
    if args.gpu_rows:
        print(gpu_rows([Path(a) for a in args.gpu_rows]))
        return 0
    results = Path(args.results)
    if args.check:
        made = render(_read(results, "benchmarks.json"), results)
        if PAGE.read_text() != made:
            print(f"{PAGE} is stale: run python bench/report.py", file=sys.stderr)
            return 1
        return 0
    print(write(results, charts=args.charts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
