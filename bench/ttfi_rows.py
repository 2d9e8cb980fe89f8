"""bench/ttfi.py's rows: one sample per container run, medians per contender, the printed table.

Ratios: ``x_floor`` (restore + first call against the floor's), ``x_eager`` and
``ready_x_floor`` (the worker's first line to the first output, against the eager
process's and the floor's), ``step_x_compiled`` (steady-state ms per call
against torch.compile's: the floor's, which runs the compiled model).
"""
from __future__ import annotations

from typing import List, Optional

from bench.common import median, table


def sample_row(r: dict, model: str, round_no: int) -> dict:
    restore = r.get("restore_s", 0.0)
    c = r.get("counters", {})
    return {"model": model, "contender": r["contender"], "round": round_no, "restore_s": restore,
            "first_call_s": r["first_call_s"], "total_s": restore + r["first_call_s"], "ready_s": r.get("ready_s"),
            "step_ms": r.get("step_ms"), "compile": r.get("compile"), "imported": r.get("imported"),
            "fxgraph_hit": c.get("fxgraph_cache_hit", 0), "fxgraph_miss": c.get("fxgraph_cache_miss", 0),
            "restore_report": {k: v for k, v in (r.get("restore") or {}).items()
                               if k in ("hit", "files", "files_present", "bytes", "bytes_written", "seconds",
                                        "failed", "warnings", "reason")}}


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def summarize(samples: List[dict], models: List[str], contenders: List[str]) -> List[dict]:
    """Medians per (model, contender), in ``contenders`` order with the floor after cold."""
    order = ["cold", "floor"] + [c for c in contenders if c != "cold"]
    rows = []
    for model in models:
        by = {c: [s for s in samples if s["model"] == model and s["contender"] == c] for c in order}
        floor = median(s["total_s"] for s in by["floor"])
        floor_ready = median(s["ready_s"] for s in by["floor"])
        floor_step = median(s["step_ms"] for s in by["floor"])
        eager_ready = median(s["ready_s"] for s in by.get("eager", []))
        cold = median(s["total_s"] for s in by["cold"])
        for c in order:
            ss = by[c]
            if not ss:
                continue
            total, ready = median(s["total_s"] for s in ss), median(s["ready_s"] for s in ss)
            step = median(s["step_ms"] for s in ss)
            rows.append({"model": model, "contender": c, "n": len(ss),
                         "restore_s": median(s["restore_s"] for s in ss),
                         "first_call_s": median(s["first_call_s"] for s in ss), "total_s": total,
                         "ready_s": ready, "step_ms": step,
                         "x_floor": _ratio(total, floor), "x_eager": _ratio(ready, eager_ready),
                         "ready_x_floor": _ratio(ready, floor_ready), "step_x_compiled": _ratio(step, floor_step),
                         "speedup_vs_cold": _ratio(cold, total),
                         "fxgraph_hits": sum(s["fxgraph_hit"] for s in ss)})
    return rows


def print_summary(rows: List[dict]) -> None:
    print(table(["model / contender", "n", "restore s", "first call s", "sum s", "x floor", "ready s", "x eager",
                 "ready x floor", "ms/step", "step x compiled"],
                [[f"{r['model']} {r['contender']}", r["n"], r["restore_s"], r["first_call_s"], r["total_s"],
                  r["x_floor"], r["ready_s"], r["x_eager"], r["ready_x_floor"], r["step_ms"], r["step_x_compiled"]]
                 for r in rows]), flush=True)


def chart_ready(rows: List[dict], path: str, goal: float = 1.5) -> None:
    """Bars of the time to first output per contender and model, with each model's eager time and
    ``goal`` times it (the one call's goal: 1.5x on the CPU, 1.25x on the H200) as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    ncols = min(len(models), 3)  # wider rows would shrink past reading on a page
    nrows = -(-len(models) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.6 * nrows), squeeze=False)
    for ax in axes.flat[len(models):]:
        ax.set_visible(False)
    for ax, model in zip(axes.flat, models):
        mine = [r for r in rows if r["model"] == model and r["ready_s"] is not None]
        ax.barh([r["contender"] for r in mine], [r["ready_s"] for r in mine], color="#4c72b0")
        eager = next((r["ready_s"] for r in mine if r["contender"] == "eager"), None)
        if eager:
            ax.axvline(eager, color="#dd8452", linestyle="--", label="eager")
            ax.axvline(goal * eager, color="#c44e52", linestyle=":", label=f"{goal:g}x eager")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_title(model)
        ax.set_xlabel("process start to first output, s (median)")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
