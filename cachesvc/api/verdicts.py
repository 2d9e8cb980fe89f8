"""Verdicts: processes say whether a restore paid off once they compiled (``client.verify()``)."""
from __future__ import annotations


from .. import auth
from .. import resolve
from ..auth import requires
from ..schemas import VerdictSchema
from .answers import VerdictAnswerSchema
from ..services import services
from . import Blueprint, body_limit, json_limit
from ..resolve import FALLBACK_STEPS

#: the largest verdict VerdictSchema takes: the most versions, each the largest id, the longest strings and
#: a float of the longest repr in range
LARGEST = {"versions": [2**31 - 1] * 100, "verdict": "paid_off", "fallback": max(FALLBACK_STEPS, key=len),
           "first_call_seconds": 1.2345678901234567e-300}

blp = Blueprint("verdicts", __name__, url_prefix="/api/v1/verdicts",
                description="What restoring processes saw after compiling")


@blp.route("", methods=["POST"])
@requires("read")
@body_limit(json_limit(LARGEST))
@blp.arguments(VerdictSchema)
@blp.response(200, VerdictAnswerSchema)
def post(body):
    """Record a restore's verdict on the versions it delivered.

    `read` scope: the processes that restore hold read tokens. A `no_hits` verdict of an exact-key
    restore (no `fallback`) sent with a token marks the version as a problem (entries API `problem`, the
    pages); an anonymous verdict (`CACHESVC_ANONYMOUS_READ`) only counts in `verify_count`
    (`counted_toward_problem` false in the answer). `first_call_seconds` (the restored process's first
    compiled call) lets a hit verdict count the compile seconds it saved in the stats: the version's
    `compile_seconds` minus it. Returns each version's counters; 404 when a version does not exist
    (nothing is recorded).
    """
    trusted = auth.current().token_id is not None
    with services().db.session() as s:
        rows = resolve.record_verdicts(s, body["versions"], body["verdict"], body["fallback"], body["first_call_seconds"],
                               trusted=trusted)
    return {"versions": rows, "counted_toward_problem": trusted and not body["fallback"]}
