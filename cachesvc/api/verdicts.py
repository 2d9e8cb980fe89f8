"""Verdicts: processes say whether a restore paid off once they compiled (``client.verify()``)."""
from __future__ import annotations

from flask_smorest import Blueprint

from .. import verdicts
from ..auth import requires
from ..schemas import VerdictSchema
from . import services

blp = Blueprint("verdicts", __name__, url_prefix="/api/v1/verdicts",
                description="What restoring processes saw after compiling")


@blp.route("", methods=["POST"])
@requires("read")
@blp.arguments(VerdictSchema)
@blp.response(200)
def post(body):
    """Record a restore's verdict on the versions it delivered.

    `read` scope: the processes that restore hold read tokens. A `no_hits` verdict of an exact-key
    restore (no `fallback`) marks the version as a problem (entries API `problem`, the pages).
    `first_call_seconds` (the restored process's first compiled call) lets a hit verdict count the
    compile seconds it saved in the stats: the version's `compile_seconds` minus it.
    Returns each version's counters; 404 when a version does not exist (nothing is recorded).
    """
    with services().db.session() as s:
        return {"versions": verdicts.record(s, body["versions"], body["verdict"], body["fallback"],
                                            body["first_call_seconds"])}
