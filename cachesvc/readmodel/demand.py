"""The fleet's demand as the API (``GET /api/v1/demand``) and the entry page read it: a model's key families,
the most called first, each with its most called shapes.

Shapes are ordered by their calls, then by their text in code-point order on both databases (PostgreSQL
compares them in the "C" collation, SQLite byte-wise, Python as str: one order), so a limit cuts every
database's list at the same shape.
"""
from __future__ import annotations

import json
from typing import Dict, Optional

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cachesvc_client.shared import keys

from .. import index
from ..models import DemandFamily, DemandShape


def _calls():
    return DemandShape.package_calls + DemandShape.compile_calls + DemandShape.eager_calls


def demand(session: Session, name: str, env: Optional[Dict[str, str]] = None, limit: int = 64) -> dict:
    """``{"items": [...]}``: the key families of ``name`` (of the environment ``env`` only, when given),
    by total calls (most first), each ``{"name", "family", "env", "tags", "calls", "shapes",
    "shapes_on_record"}`` with its ``limit`` most called shapes, each ``{"shape", "calls", "served":
    {"package", "compile", "eager"}, "first_seen", "last_seen"}``. No family: no items."""
    conds = [DemandFamily.name == name] + [getattr(DemandFamily, f) == env[f] for f in keys.ENV_FIELDS if env]
    families = {f.id: f for f in session.scalars(select(DemandFamily).where(*conds))}
    if not families:
        return {"items": []}
    totals = {fid: (int(calls), n) for fid, calls, n in session.execute(
        select(DemandShape.family_id, func.sum(_calls()), func.count())
        .where(DemandShape.family_id.in_(list(families))).group_by(DemandShape.family_id))}
    shapes = _top_shapes(session, list(families), limit)
    items = [{"name": f.name, "family": f.family_digest, "env": f.env(), "tags": json.loads(f.tags),
              "calls": totals.get(fid, (0, 0))[0], "shapes": shapes.get(fid, []),
              "shapes_on_record": totals.get(fid, (0, 0))[1]}
             for fid, f in families.items()]
    items.sort(key=lambda item: (-item["calls"], item["family"]))
    return {"items": items}


def _top_shapes(session: Session, family_ids: list, limit: int) -> Dict[int, list]:
    """family id -> its ``limit`` most called shapes (one query: a row number per family)."""
    shape = DemandShape.shape
    if session.get_bind().dialect.name == "postgresql":
        shape = shape.collate("C")
    calls = _calls().label("calls")
    rank = func.row_number().over(partition_by=DemandShape.family_id, order_by=(calls.desc(), shape)).label("rank")
    ranked = (select(DemandShape.family_id, DemandShape.shape, DemandShape.package_calls, DemandShape.compile_calls,
                     DemandShape.eager_calls, DemandShape.first_seen, DemandShape.last_seen, calls, rank)
              .where(DemandShape.family_id.in_(family_ids)).subquery())
    out: Dict[int, list] = {}
    for r in session.execute(select(ranked).where(ranked.c.rank <= limit).order_by(ranked.c.family_id,
                                                                                   ranked.c.rank)):
        out.setdefault(r.family_id, []).append({
            "shape": r.shape, "calls": int(r.calls),
            "served": {"package": int(r.package_calls), "compile": int(r.compile_calls), "eager": int(r.eager_calls)},
            "first_seen": index.iso(r.first_seen), "last_seen": index.iso(r.last_seen)})
    return out
