"""Browse entries (JSON). Fuller filters, sorts and HTML pages build on this."""
from __future__ import annotations


from flask_smorest import Blueprint
from sqlalchemy import func, select

from cachesvc_client import keys

from .. import index
from ..models import Entry, Version
from ..schemas import EntryFilterArgs
from . import services

blp = Blueprint("entries", __name__, url_prefix="/api/v1/entries", description="Browse cache entries")

_FIELDS = ("name", "shape") + keys.ENV_FIELDS


def _stats_subquery():
    newest = (select(Version.entry_id, func.count(Version.id).label("versions"),
                     func.max(Version.id).label("newest_id"))
              .where(Version.state == "committed").group_by(Version.entry_id).subquery())
    return newest


@blp.route("", methods=["GET"])
@blp.arguments(EntryFilterArgs, location="query")
@blp.response(200)
def list_entries(args):
    """Entries with at least one committed version, newest first; filter on any key field."""
    agg = _stats_subquery()
    q = (select(Entry, agg.c.versions, Version.total_bytes)
         .join(agg, agg.c.entry_id == Entry.id)
         .join(Version, Version.id == agg.c.newest_id))
    for field in _FIELDS:
        if field in args:
            q = q.where(getattr(Entry, field) == args[field])
    if "tags" in args:
        q = q.where(Entry.tags == keys.canonical_tags(index.parse_tags(args["tags"])))
    count_q = select(func.count()).select_from(q.subquery())
    q = q.order_by(agg.c.newest_id.desc()).limit(args["limit"]).offset(args["offset"])
    svc = services()
    with svc.db.session() as s:
        total = s.scalar(count_q)
        rows = [dict(index.entry_summary(e), versions=n, size=size) for e, n, size in s.execute(q)]
    return {"total": total, "limit": args["limit"], "offset": args["offset"], "entries": rows}


@blp.route("/<int:entry_id>", methods=["GET"])
@blp.response(200)
def get_entry(entry_id):
    """An entry with its committed versions, newest first."""
    svc = services()
    with svc.db.session() as s:
        entry = index.get_or_404(s, Entry, entry_id, "entry")
        versions = s.scalars(select(Version).where(Version.entry_id == entry_id, Version.state == "committed")
                             .order_by(Version.id.desc())).all()
        return dict(index.entry_summary(entry), versions=[index.version_summary(v) for v in versions])
