"""Usage: processes report the calls each input shape of their models made (``cachesvc_client.compile``)."""
from __future__ import annotations

import functools

from flask import request

from cachesvc_client.shared import keys

from .. import auth, demand
from ..auth import requires
from ..schemas import ErrorSchema, MAX_CALLS, MAX_USAGE_REPORTS, MAX_USAGE_SHAPES, SERVED_BY, UsageSchema
from ..services import services
from . import Blueprint, body_limit, json_limit
from .answers import UsageAnswerSchema

#: JSON escapes a character past the BMP as a surrogate pair, 12 bytes: the widest one character is written
_WIDEST = "\U0001F600"

#: the largest report UsageSchema takes: the most families and shapes, every text its longest in the widest
#: characters, every count the largest, the most tags with the longest keys, a float of the longest repr
LARGEST = {"reports": [{
    "key": {"name": _WIDEST * keys.MAX_NAME,
            "tags": {f"{i:0>{keys.MAX_TAG_KEY}}": _WIDEST * keys.MAX_TAG_VALUE for i in range(keys.MAX_TAGS)},
            "env": {f: _WIDEST * keys.MAX_ENV_VALUE for f in keys.ENV_FIELDS}},
    "shapes": [{"shape": _WIDEST * (keys.MAX_SHAPE - 1) + chr(ord(_WIDEST) + i),  # each shape once
                "served": {how: MAX_CALLS for how in SERVED_BY}} for i in range(MAX_USAGE_SHAPES)]}
    ] * MAX_USAGE_REPORTS, "seconds": 1.2345678901234567e-300}

blp = Blueprint("usage", __name__, url_prefix="/api/v1/usage",
                description="The calls each input shape made across the fleet, as its processes report them")


def _sender() -> str:
    """Whom the flood limit counts: the token, or for an anonymous report the client's address."""
    token_id = auth.current().token_id
    return f"token:{token_id}" if token_id is not None else f"address:{request.remote_addr or 'unknown'}"


def _within_rate(view):
    """Count the report against its sender's limit before its body is parsed, so a flood of reports, well
    formed or not, costs a dict lookup each, not a JSON parse."""
    @functools.wraps(view)
    def counted(*args, **kwargs):
        svc = services()
        demand.check_rate(svc.usage_limiter, _sender(), svc.settings.USAGE_REPORTS_PER_MINUTE)
        return view(*args, **kwargs)
    return counted


@blp.route("", methods=["POST"])
@requires("read")
@body_limit(json_limit(LARGEST))
@_within_rate
@blp.arguments(UsageSchema)
@blp.response(200, UsageAnswerSchema)
@blp.alt_response(429, schema=ErrorSchema, description="Too many reports from this token (or address) this minute "
                  "(CACHESVC_USAGE_REPORTS_PER_MINUTE, counted per serving process); nothing recorded. "
                  "`Retry-After` says in how many seconds to send again")
def post(body):
    """Add a process's calls per input shape, by how each was served, to its models' demand.

    `read` scope, as verdicts: serving processes hold read tokens (anonymous with
    `CACHESVC_ANONYMOUS_READ`). One item per key family (a model's key without its shape), each shape once.
    Kept only for a name that has an entry; a new key family past `CACHESVC_DEMAND_MAX_FAMILIES` a name, or a
    new shape past `CACHESVC_DEMAND_MAX_SHAPES` a family, is dropped (listed in `dropped` with why), while
    those on record keep counting. Every request counts toward `CACHESVC_USAGE_REPORTS_PER_MINUTE`.
    """
    svc = services()
    caps = demand.Caps(shapes=svc.settings.DEMAND_MAX_SHAPES, families=svc.settings.DEMAND_MAX_FAMILIES)
    with svc.db.session() as s:
        return {"recorded": demand.record(s, body["reports"], caps)}
