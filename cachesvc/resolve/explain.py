"""Why a resolve missed: the nearest existing entries and which key fields differ.

Nearest means close, by a distance of two parts: the same name first (another
model is never nearer than this one built elsewhere), then the fewest differing
key fields (``FIELDS``: name, shape, tags, then the environment fields), newest
first among equals. Candidates are the entries with a committed version that
share the wanted key's name, or its whole environment and its shape or tags
too: an entry that differs in name, shape and tags at once is another model
with other inputs, not a near miss, and is never named. Each candidate comes back as::

    {"entry": <entry summary>, "version_id": <its newest committed version>,
     "differs": [{"field": "torch", "wanted": "2.13.1", "have": "2.13.0"}, ...],
     "env_differs": true}   # a fallback may never cross the environment

The client prints ``differs`` as ``torch 2.13.1 != 2.13.0`` (wanted first).
"""
from __future__ import annotations

from typing import Dict, List

from sqlalchemy import and_, case, or_, select
from sqlalchemy.orm import Session

from cachesvc_client.shared import keys

from .. import index
from ..models import Entry

FIELDS = ("name", "shape", "tags") + keys.ENV_FIELDS

#: candidates returned with a miss
NEAREST = 5
#: best-ranked entries checked for a committed version (entries without one are rare: GC removes them)
SHORTLIST = 50


def _wanted(key: dict) -> Dict[str, str]:
    return {"name": key["name"], "shape": key["shape"], "tags": keys.canonical_tags(key["tags"]), **key["env"]}


def differences(entry: Entry, key: dict) -> List[dict]:
    """The key fields in which ``entry`` differs from ``key``, in ``FIELDS`` order; tags as JSON text."""
    wanted = _wanted(key)
    return [{"field": f, "wanted": wanted[f], "have": getattr(entry, f)} for f in FIELDS
            if getattr(entry, f) != wanted[f]]


def nearest(session: Session, key: dict, limit: int = NEAREST) -> List[dict]:
    """The ``limit`` committed entries closest to ``key`` (see the module docstring); [] when none is close.

    One statement: the entries sharing the name or the environment ranked by differing fields (a scan
    of the entries table, no join), of which the best ``SHORTLIST`` are checked for a committed version.
    """
    wanted = _wanted(key)
    same_env = and_(*(getattr(Entry, f) == key["env"][f] for f in keys.ENV_FIELDS))
    same_input = or_(Entry.shape == wanted["shape"], Entry.tags == wanted["tags"])
    other_name = case((Entry.name != wanted["name"], 1), else_=0)
    ndiff = sum(case((getattr(Entry, f) != wanted[f], 1), else_=0) for f in FIELDS)
    short = (select(Entry.id, other_name.label("other_name"), ndiff.label("ndiff"))
             .where(or_(Entry.name == wanted["name"], and_(same_env, same_input)))
             .order_by(other_name, ndiff, Entry.id.desc()).limit(SHORTLIST).subquery())
    newest = index.newest_version_id(short.c.id).label("version_id")
    ranked = select(short.c.id, short.c.other_name, short.c.ndiff, newest).subquery()
    rows = session.execute(select(Entry, ranked.c.version_id).join(ranked, ranked.c.id == Entry.id)
                           .where(ranked.c.version_id.is_not(None))
                           .order_by(ranked.c.other_name, ranked.c.ndiff, Entry.id.desc()).limit(limit)).all()
    out = []
    for entry, version_id in rows:
        differs = differences(entry, key)
        out.append({"entry": index.entry_summary(entry), "version_id": version_id, "differs": differs,
                    "env_differs": any(d["field"] in keys.ENV_FIELDS for d in differs)})
    return out
