"""A usage report recorded: each item's calls added to its key family's shapes, within the caps.

An item is a key family (name, tags, environment) and up to 64 shapes, each with its calls by how they
were served (``package``, ``compile``, ``eager``). It is recorded only where the name has an entry (a read
token may report, and must not make names without end); a new family only while its name has fewer than
``Caps.families``; a new shape only while its family has fewer than ``Caps.shapes`` (the new shapes with
the most calls first). What does not fit is in the answer's ``dropped``, with the reason; shapes and
families on record always keep counting, and nothing is evicted.

Concurrency: all recording for a name is serialised on the name, so its caps are exact: on PostgreSQL
by an advisory lock of the name (each request takes its names' locks in one order, so two requests never
wait on each other crosswise), on SQLite by the database's write lock, taken before anything is read. The
calls are added by an upsert (``calls = calls + excluded.calls``), so two reports of one shape both count.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Set

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from cachesvc_client.shared import keys

from ..models import DemandFamily, DemandShape, Entry, utcnow

#: the advisory-lock key space of the names' locks ("dmnd"), apart from the store lock's and the blobs'
_NAME_LOCK_SPACE = 0x646D6E64
SERVED_BY = ("package", "compile", "eager")


@dataclass(frozen=True)
class Caps:
    """How much demand is kept: ``shapes`` per key family (CACHESVC_DEMAND_MAX_SHAPES), ``families`` per
    name (CACHESVC_DEMAND_MAX_FAMILIES)."""
    shapes: int
    families: int


def record(session: Session, reports: List[dict], caps: Caps, now=None) -> List[dict]:
    """Record ``reports`` (items as ``schemas.UsageReportSchema`` loads them) in ``session``'s transaction.

    Returns one ``{"name", "family", "shapes", "dropped": [{"shape", "reason"}]}`` per item, in order:
    ``family`` the family's digest, ``shapes`` how many of its shapes were recorded. Items of one family
    in one request both count. Thread- and process-safe (the module docstring says how)."""
    now = now or utcnow()
    names = sorted({r["key"]["name"] for r in reports})
    _lock_names(session, names)
    published = set(session.scalars(select(Entry.name).where(Entry.name.in_(names)).distinct()))
    return [_record_item(session, item, caps, now) if item["key"]["name"] in published
            else _answer(item, 0, item["shapes"], _unpublished(item["key"]["name"])) for item in reports]


def _unpublished(name: str) -> str:
    return (f"no entry is named {name!r}: demand is kept for published models (publish it once: "
            f"cachesvc_client.compile does after a miss, or a build job: cachesvc-client build)")


def _lock_names(session: Session, names: List[str]) -> None:
    """Serialise, until ``session`` commits, every recording for ``names``."""
    if session.get_bind().dialect.name != "postgresql":  # SQLite: a write statement takes the write lock
        session.execute(text("UPDATE demand_families SET id = id WHERE 1 = 0"))
        return
    for key in sorted({_name_key(n) for n in names}):  # one order for every request: no deadlock
        session.execute(text("SELECT pg_advisory_xact_lock(CAST(:space AS integer), CAST(:key AS integer))"),
                        {"space": _NAME_LOCK_SPACE, "key": key})


def _name_key(name: str) -> int:
    return int(hashlib.sha256(name.encode("utf-8")).hexdigest()[:7], 16)  # below 2**28: an integer lock key


def _shape_digest(shape: str) -> str:
    return hashlib.sha256(shape.encode("utf-8")).hexdigest()


def _calls(item: dict) -> int:
    return sum(item["served"][how] for how in SERVED_BY)


def _answer(report: dict, recorded: int, dropped: List[dict], reason: str) -> dict:
    """What the answer says of a report item: its family, how many shapes were recorded, which were dropped
    and why (one reason: an item is dropped whole, or its new shapes past the cap)."""
    key = report["key"]
    return {"name": key["name"], "family": keys.family_digest(key["name"], key["tags"], key["env"]),
            "shapes": recorded, "dropped": [{"shape": s["shape"], "reason": reason} for s in dropped]}


def _record_item(session: Session, report: dict, caps: Caps, now) -> dict:
    key = report["key"]
    digest = keys.family_digest(key["name"], key["tags"], key["env"])
    family_id = session.scalar(select(DemandFamily.id).where(DemandFamily.family_digest == digest))
    if family_id is None:
        families = session.scalar(select(func.count()).select_from(DemandFamily)
                                  .where(DemandFamily.name == key["name"]))
        if families >= caps.families:
            return _answer(report, 0, report["shapes"], f"{key['name']!r} has {families} key families (tags and "
                           f"environments) on record, the most CACHESVC_DEMAND_MAX_FAMILIES keeps; the families on "
                           f"record keep counting")
    kept, over = _fit(session, family_id, report["shapes"], caps.shapes)
    if kept and family_id is None:
        family_id = _new_family(session, key, digest, now)
    _add_calls(session, family_id, kept, now)
    return _answer(report, len(kept), over, f"this key family has {caps.shapes} shapes on record, the most "
                   f"CACHESVC_DEMAND_MAX_SHAPES keeps; the shapes on record keep counting")


def _fit(session: Session, family_id: Optional[int], shapes: List[dict], cap: int) -> tuple:
    """(the shapes to record, the new ones past the cap, in the report's order): every shape on record,
    and new ones while the family has room, the most called first."""
    digests = [_shape_digest(s["shape"]) for s in shapes]
    on_record: Set[str] = set()
    count = 0
    if family_id is not None:
        on_record = set(session.scalars(select(DemandShape.shape_digest).where(
            DemandShape.family_id == family_id, DemandShape.shape_digest.in_(digests))))
        count = session.scalar(select(func.count()).select_from(DemandShape)
                               .where(DemandShape.family_id == family_id))
    new = sorted((i for i, d in enumerate(digests) if d not in on_record), key=lambda i: -_calls(shapes[i]))
    admitted = set(new[:max(0, cap - count)]) | {i for i, d in enumerate(digests) if d in on_record}
    return ([s for i, s in enumerate(shapes) if i in admitted],
            [s for i, s in enumerate(shapes) if i not in admitted])


def _new_family(session: Session, key: dict, digest: str, now) -> int:
    family = DemandFamily(family_digest=digest, name=key["name"], tags=keys.canonical_tags(key["tags"]),
                          created_at=now, **key["env"])
    session.add(family)
    session.flush()
    return family.id


def _add_calls(session: Session, family_id: Optional[int], shapes: List[dict], now) -> None:
    """Add ``shapes``' calls to the family's rows, making the rows missing (one upsert per dialect)."""
    if not shapes:
        return
    t = DemandShape.__table__
    stmt = (pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert)(t)
    added: Dict[str, object] = {f"{how}_calls": t.c[f"{how}_calls"] + stmt.excluded[f"{how}_calls"]
                                for how in SERVED_BY}
    stmt = stmt.on_conflict_do_update(index_elements=[t.c.family_id, t.c.shape_digest],
                                      set_={**added, "last_seen": stmt.excluded.last_seen})
    rows = [{"family_id": family_id, "shape_digest": _shape_digest(s["shape"]), "shape": s["shape"],
             **{f"{how}_calls": s["served"][how] for how in SERVED_BY}, "first_seen": now, "last_seen": now}
            for s in shapes]
    session.execute(stmt, sorted(rows, key=lambda r: r["shape_digest"]))
