"""What the cache holds, costs and saves."""
from __future__ import annotations


from .. import readmodel
from ..auth import requires
from ..schemas import StatsArgs
from .answers import StatsSchema
from ..services import services
from . import Blueprint

blp = Blueprint("stats", __name__, url_prefix="/api/v1/stats", description="Cache statistics")


@blp.route("", methods=["GET"])
@requires("read")
@blp.arguments(StatsArgs, location="query")
@blp.response(200, StatsSchema)
def get_stats(args):
    """Entries, versions, blobs; logical against stored bytes (`dedup_ratio`); publishes; `restores`
    (resolves that delivered a version), `fallbacks` (of those, answered by a fallback), `misses`
    (delivered nothing), `restore_rate`; `verdicts` by kind, `hits` (verdicts that saw cache hits),
    `hit_rate` (of the verdicts); `compile_seconds_saved` (cold compile minus the restored first
    call, from exact-key hit verdicts that sent `first_call_seconds`); and a daily series of
    stored bytes, restores, misses, hits and publishes."""
    with services().db.session() as s:
        return dict(readmodel.totals(s), daily=readmodel.daily(s, args["days"]))
