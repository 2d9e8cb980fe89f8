"""Resolve a key to the version a restore should fetch."""
from __future__ import annotations


from cachesvc_client.shared.keys import ENV_FIELDS

from .. import index, metrics
from .. import resolve as resolving
from ..schemas import ResolveArgs
from ..auth import requires
from .version_answers import ResolveAnswerSchema
from ..services import services
from . import Blueprint

blp = Blueprint("resolve", __name__, url_prefix="/api/v1/resolve", description="Find what to restore")


@blp.route("", methods=["GET"])
@requires("read")
@blp.arguments(ResolveArgs, location="query")
@blp.response(200, ResolveAnswerSchema)
def resolve(args):
    """The newest committed version of `kind` (default inductor-dir) whose key matches exactly, with a URL
    per blob.

    Without one, the first `fallback` step that finds versions answers (`fallback` says which step and
    versions; never across an environment field), else `hit: false` with `reason` and `nearest`: the
    closest committed entries and, for each, the key fields that differ (`field`, `wanted`, `have`).
    """
    key = {"name": args["name"], "shape": args["shape"], "tags": index.parse_tags(args["tags"]),
           "env": {f: args[f] for f in ENV_FIELDS}}
    svc = services()
    with svc.db.session() as s:
        answer = resolving.resolve(s, svc.storage, svc.settings, key, args["fallback"], args.get("fallback_max_bytes"),
                                   hits=svc.hits, kind=args["kind"], count=args["count"])
    presigned = sum(b["stored_size"] for b in answer.get("blobs", {}).values()
                    if not b.get("pack", b["url"]).startswith("/"))
    metrics.current().bytes_out.labels("presigned").inc(presigned)
    return answer
