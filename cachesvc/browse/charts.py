"""Server-side SVG charts for the HTML pages (no JavaScript anywhere)."""
from __future__ import annotations

from typing import List

from markupsafe import Markup, escape

from .filters import human_bytes, plural


def _ticks(top: float, n: int = 4) -> List[float]:
    return [top * i / n for i in range(n + 1)]


def stored_and_restores(rows: List[dict], width: int = 760, height: int = 260) -> Markup:
    """Stored bytes (line, left axis) and restores (bars, right axis), one point per day of ``rows``."""
    left, right, top, bottom = 70, 50, 20, 40
    w, h = width - left - right, height - top - bottom
    n = max(len(rows), 1)
    max_bytes = max([r["stored_bytes"] for r in rows] + [1])
    max_restores = max([r["restores"] for r in rows] + [1])
    if max_restores > 4:
        max_restores = -(-max_restores // 4) * 4  # a multiple of 4, so the 4 tick steps are whole
    step = w / n
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" class="chart">',
             '<title>Stored bytes and restores per day</title>',
             f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fafafa" stroke="#ccc"/>']
    for t in _ticks(max_bytes):
        y = top + h - h * t / max_bytes
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">'
                     f'{escape(human_bytes(t))}</text>')
    for t in _ticks(max_restores, min(4, max_restores)):  # whole numbers only
        y = top + h - h * t / max_restores
        parts.append(f'<text x="{left + w + 6}" y="{y + 4:.1f}" font-size="11" fill="#b35900">{t:.0f}</text>')
    for i, r in enumerate(rows):
        bh = h * r["restores"] / max_restores
        x = left + i * step + step * 0.15
        parts.append(f'<rect class="restores" x="{x:.1f}" y="{top + h - bh:.1f}" width="{step * 0.7:.1f}" '
                     f'height="{bh:.1f}" fill="#f0a050"><title>{escape(r["date"])}: {plural(r["restores"], "restore")}</title></rect>')
    points = " ".join(f"{left + (i + 0.5) * step:.1f},{top + h - h * r['stored_bytes'] / max_bytes:.1f}"
                      for i, r in enumerate(rows))
    if points:
        parts.append(f'<polyline class="stored" points="{points}" fill="none" stroke="#2060c0" stroke-width="2"/>')
    label_every = max(1, n // 8)
    for i, r in enumerate(rows):
        if i % label_every == 0:
            parts.append(f'<text x="{left + (i + 0.5) * step:.1f}" y="{top + h + 16}" font-size="11" '
                         f'text-anchor="middle">{escape(r["date"][5:])}</text>')
    parts.append(f'<text x="{left}" y="{height - 6}" font-size="12" fill="#2060c0">— stored bytes (left)</text>')
    parts.append(f'<text x="{left + 200}" y="{height - 6}" font-size="12" fill="#b35900">■ restores per day (right)</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def hit_rate(rows: List[dict], width: int = 760, height: int = 200) -> Markup:
    """The daily hit rate of the verdicts (a point per day that had verdicts, joined), 0-100 %."""
    left, right, top, bottom = 70, 50, 20, 40
    w, h = width - left - right, height - top - bottom
    step = w / max(len(rows), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" class="chart hit-rate">',
             '<title>Hit rate of the verdicts per day</title>',
             f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fafafa" stroke="#ccc"/>']
    for pct in (0, 25, 50, 75, 100):
        y = top + h - h * pct / 100
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{pct} %</text>')
    points = []
    for i, r in enumerate(rows):
        if r.get("hit_rate") is None:
            continue
        x, y = left + (i + 0.5) * step, top + h - h * r["hit_rate"]
        points.append(f"{x:.1f},{y:.1f}")
        parts.append(f'<circle class="day-rate" cx="{x:.1f}" cy="{y:.1f}" r="3" fill="#208040"><title>'
                     f'{escape(r["date"])}: {r["hit_rate"] * 100:.0f} % of {r["verdicts"]} verdicts saw hits'
                     f'</title></circle>')
    if len(points) > 1:
        parts.append(f'<polyline class="rate" points="{" ".join(points)}" fill="none" stroke="#208040" '
                     f'stroke-width="2"/>')
    label_every = max(1, len(rows) // 8)
    for i, r in enumerate(rows):
        if i % label_every == 0:
            parts.append(f'<text x="{left + (i + 0.5) * step:.1f}" y="{top + h + 16}" font-size="11" '
                         f'text-anchor="middle">{escape(r["date"][5:])}</text>')
    if not points:
        parts.append(f'<text x="{left + w / 2:.1f}" y="{top + h / 2:.1f}" font-size="13" text-anchor="middle" '
                     f'fill="#777">no verdicts in these days</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


#: how a call was served, its colour and its legend, in the order the bars stack
SERVED = (("package", "#2060c0", "a package"), ("compile", "#f0a050", "torch.compile"),
          ("eager", "#999999", "eager (uncompiled)"))
SHAPE_LABEL = 34  # characters of a shape shown beside its bar (the whole text in its tooltip)


def shape_demand(shapes: List[dict], width: int = 760, top_n: int = 20) -> Markup:
    """The most called shapes of a key family (``readmodel.demand``'s rows, the first ``top_n``), one
    horizontal bar each, split by how the calls were served (package, torch.compile, eager), with a legend.
    Shapes are reported text, untrusted: escaped, and cut to fit beside the bar."""
    rows = shapes[:top_n]
    left, right, top, row_h, legend_h = 250, 80, 10, 22, 34
    w = width - left - right
    height = top + max(len(rows), 1) * row_h + legend_h
    most = max([r["calls"] for r in rows] + [1])
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" class="chart demand">',
             '<title>Calls per input shape, by how each was served</title>']
    for i, r in enumerate(rows):
        y = top + i * row_h
        shape = r["shape"]
        label = shape if len(shape) <= SHAPE_LABEL else shape[:SHAPE_LABEL - 1] + "…"
        parts.append(f'<text class="shape-label" x="{left - 6}" y="{y + row_h * 0.65:.1f}" font-size="11" '
                     f'text-anchor="end">{escape(label)}<title>{escape(shape)}</title></text>')
        x = float(left)
        for how, colour, legend in SERVED:
            n = r["served"][how]
            if not n:
                continue
            bw = w * n / most
            parts.append(f'<rect class="served-{how}" x="{x:.1f}" y="{y + 3}" width="{bw:.1f}" height="{row_h - 6}" '
                         f'fill="{colour}"><title>{escape(shape)}: {plural(n, "call")} served by {legend}</title>'
                         f'</rect>')
            x += bw
        parts.append(f'<text x="{x + 4:.1f}" y="{y + row_h * 0.65:.1f}" font-size="11">{r["calls"]}</text>')
    y = top + max(len(rows), 1) * row_h + 14
    for i, (how, colour, legend) in enumerate(SERVED):
        x = left + i * 160
        parts.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{colour}"/>')
        parts.append(f'<text x="{x + 16}" y="{y + 10}" font-size="12">served by {legend}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
