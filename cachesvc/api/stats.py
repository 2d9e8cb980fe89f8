"""What the cache holds, costs and saves."""
from __future__ import annotations

from flask_smorest import Blueprint

from .. import stats
from ..auth import requires
from ..schemas import StatsArgs
from . import services

blp = Blueprint("stats", __name__, url_prefix="/api/v1/stats", description="Cache statistics")


@blp.route("", methods=["GET"])
@requires("read")
@blp.arguments(StatsArgs, location="query")
@blp.response(200)
def get_stats(args):
    """Entries, versions, blobs; logical against stored bytes (`dedup_ratio`); publishes, restores, hits,
    misses, `fallbacks` (versions delivered by fallback restores); compile seconds saved (each hit counts its version's `compile_seconds`); and a daily series
    of stored bytes, hits, misses and publishes."""
    with services().db.session() as s:
        return dict(stats.totals(s), daily=stats.daily(s, args["days"]))
