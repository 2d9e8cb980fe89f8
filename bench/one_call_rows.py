"""The one call's rows from GPU runs: a table (markdown) and a chart, from the test's and ttfi's output.

    python bench/one_call_rows.py bench/results/gpu/run15-compile-resnet50.jsonl bench/results/gpu/run15-ttfi-vit.json ... \
        --chart docs/img/benchmarks-one-call-gpu.png --goal 1.25

A ``.jsonl`` is tests/e2e/test_gpu_compile.py's $CACHESVC_GPU_RESULTS (one sample per contender:
its cold, floor, restarted and eager containers); a ``.json`` is bench/ttfi.py's --out (medians).
Each model's rows: first call, ready (process start to first output), ratios to eager's and the
floor's ready, ms per step and its ratio to torch.compile's (the floor's). Later files win for a
model and mode already read.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ttfi_rows import chart_ready  # noqa: E402

CONTENDERS = ("cold", "floor", "eager", "cachesvc-compile", "cachesvc-local")
#: the GPU test's container names -> ttfi's contender names
TEST_NAMES = {"cold": "cold", "floor": "floor", "eager": "eager", "warm": "cachesvc-compile"}


def from_test(line: dict, source: str) -> List[dict]:
    label = line["model"] + ("" if line.get("mode", "default") == "default" else "@" + line["mode"])
    return [{"model": label, "contender": name, "n": 1, "source": source, "first_call_s": line[f"{key}_first_call_s"],
             "ready_s": line[f"{key}_ready_s"], "step_ms": line[f"{key}_step_ms"]} for key, name in TEST_NAMES.items()]


def from_ttfi(doc: dict, source: str) -> List[dict]:
    return [dict({k: r[k] for k in ("model", "contender", "n", "first_call_s", "ready_s", "step_ms")}, source=source)
            for r in doc["rows"] if r["contender"] in CONTENDERS and r.get("ready_s") is not None]


def read(paths: List[str]) -> List[dict]:
    by_model: Dict[str, List[dict]] = {}
    for path in paths:
        text = Path(path).read_text()
        rows = ([r for line in text.splitlines() if line.strip() for r in from_test(json.loads(line), Path(path).name)]
                if path.endswith(".jsonl") else from_ttfi(json.loads(text), Path(path).name))
        for model in dict.fromkeys(r["model"] for r in rows):
            by_model[model] = [r for r in rows if r["model"] == model]
    out = []
    # each model's default mode first, then its other modes, in the order the files name the models
    first_seen = list(dict.fromkeys(m.split("@")[0] for m in by_model))
    order = sorted(by_model, key=lambda m: (first_seen.index(m.split("@")[0]), "@" in m, m))
    for rows in (by_model[m] for m in order):
        ref = {r["contender"]: r for r in rows}
        for r in sorted(rows, key=lambda r: CONTENDERS.index(r["contender"])):
            r["x_eager"] = r["ready_s"] / ref["eager"]["ready_s"]
            r["x_floor"] = r["ready_s"] / ref["floor"]["ready_s"]
            r["step_x_compiled"] = r["step_ms"] / ref["floor"]["step_ms"]
            out.append(r)
    return out


def markdown(rows: List[dict]) -> str:
    lines = ["| model | contender | n | first call s | ready s | x eager | x floor (ready) | ms/step "
             "| x torch.compile (ms/step) | data |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        bold = "**" if r["contender"] == "cachesvc-compile" else ""
        lines.append(f"| {r['model']} | {bold}{r['contender']}{bold} | {r['n']} | {r['first_call_s']:.2f} | "
                     f"{bold}{r['ready_s']:.2f}{bold} | {bold}{r['x_eager']:.2f}{bold} | {r['x_floor']:.2f} | "
                     f"{r['step_ms']:.2f} | {r['step_x_compiled']:.2f} | {r['source']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--chart", default=None, help="write a PNG of the time to first output here")
    ap.add_argument("--goal", type=float, default=1.25, help="the goal's multiple of eager, drawn on the chart")
    args = ap.parse_args()
    rows = read(args.files)
    print(markdown(rows))
    if args.chart:
        chart_ready(rows, args.chart, goal=args.goal)
    return 0


if __name__ == "__main__":
    sys.exit(main())
