"""Jinja filters of the HTML pages: sizes, counts with their noun, Markdown code spans, relative times.

Registered on the app by ``cachesvc.browse.register_pages``; every page formats these one way.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Optional

from flask import Flask
from markupsafe import Markup, escape

_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def human_bytes(n) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # unreachable; keeps type checkers calm


def plural(n, noun: str, nouns: Optional[str] = None) -> str:
    """``1 file``, ``2 files`` (``nouns`` for an irregular plural: ``plural(n, "entry", "entries")``)."""
    n = 0 if n is None else n
    return f"{n} {noun if n == 1 else (nouns or noun + 's')}"


def code_spans(text) -> Markup:
    """``text`` escaped, its Markdown code spans (`like this`, as the errors write names) as <code>."""
    return Markup(_CODE_SPAN.sub(lambda m: f"<code>{m.group(1)}</code>", str(escape(text or ""))))


def _parse(value) -> Optional[dt.datetime]:
    if isinstance(value, dt.datetime):
        when = value
    else:
        try:
            when = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return None
    return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


def relative(seconds: float) -> str:
    """``seconds`` ago as a person says it: ``just now``, ``5 min ago``, ``3 h ago``, ``12 days ago``."""
    future, s = seconds < 0, abs(seconds)
    if s < 45:
        return "just now"
    for size, unit in ((86400 * 365, "y"), (86400, "day"), (3600, "h"), (60, "min")):
        if s >= size:
            n = round(s / size)
            text = plural(n, unit) if unit == "day" else f"{n} {unit}"
            return f"in {text}" if future else f"{text} ago"
    return "just now"  # unreachable: s >= 45 is at least a minute once rounded


def ago(value, default: str = "never", now: Optional[dt.datetime] = None) -> Markup:
    """A timestamp (ISO string or datetime) as ``<time>`` reading "3 h ago", the exact UTC time on hover.
    Computed here, on the server: the pages run no script."""
    when = _parse(value) if value else None
    if when is None:
        return Markup('<span class="muted">{}</span>').format(value or default)
    now = now or dt.datetime.now(dt.timezone.utc)
    exact = when.astimezone(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(exact, relative((now - when).total_seconds()))


def install(app: Flask) -> None:
    app.add_template_filter(human_bytes, "bytes")
    app.add_template_filter(plural, "plural")
    app.add_template_filter(code_spans, "code_spans")
    app.add_template_filter(ago, "ago")
