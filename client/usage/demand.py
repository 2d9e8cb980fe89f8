"""What the fleet served and what its key families hold, as the service answers (``GET /api/v1/demand``,
``GET /api/v1/entries``), read defensively: its bytes are untrusted."""
from __future__ import annotations

from typing import Any, Dict, List, Optional


def demand_rows(answer: Any, tags: Optional[Dict[str, str]]) -> List[Dict[str, Any]]:
    """The shapes of the answer's key families whose tags are ``tags`` (None: every family, merged), busiest
    first: ``[{"shape", "calls", "served", "first_seen", "last_seen"}]``. Rows that are not so are left out."""
    merged: Dict[str, Dict[str, Any]] = {}
    for family in _objects(answer, "items"):
        if tags is not None and family.get("tags") != tags:
            continue
        for row in _objects(family, "shapes"):
            if isinstance(row.get("shape"), str) and type(row.get("calls")) is int and row["calls"] >= 0:
                into = merged.setdefault(row["shape"], {**row, "calls": 0})
                into["calls"] += row["calls"]
    return sorted(merged.values(), key=lambda r: (-r["calls"], r["shape"]))


def package_shapes(answer: Any) -> List[str]:
    """The shape texts of an entries listing (``GET /api/v1/entries``), the rest left out."""
    return [e["shape"] for e in _objects(answer, "entries") if isinstance(e.get("shape"), str)]


def _objects(answer: Any, field: str) -> List[Dict[str, Any]]:
    items = answer.get(field) if isinstance(answer, dict) else None
    return [x for x in items if isinstance(x, dict)] if isinstance(items, list) else []
