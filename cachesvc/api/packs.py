"""Pack bytes through the service: used by the local backend (and S3 with presigning off)."""
from __future__ import annotations

from flask import Response, request

from .. import auth, content, metrics
from ..auth import requires
from ..schemas import ErrorSchema, PackPutArgs
from .answers import PackStoredSchema
from ..services import services
from . import BINARY_BODY, Blueprint, body_limit, digest_arg
from .blobs import send_object, stored_answer

blp = Blueprint("packs", __name__, url_prefix="/api/v1/packs", description="Packs of small blobs")


@blp.route("/<sha256>", methods=["PUT"])
@requires("write")
@body_limit(content.MAX_PACK, streamed=True)
@blp.arguments(PackPutArgs, location="query")
@blp.response(201, PackStoredSchema)
@blp.alt_response(200, schema=PackStoredSchema, description="Another publish's commit recorded the pack since this version asked for its "
                                   "target; the body was checked, nothing was written (`status: already_stored`)")
@blp.alt_response(409, schema=ErrorSchema, description="The pack is recorded and this version never asked for "
                                                        "its target: stored packs are never overwritten")
@blp.doc(requestBody=BINARY_BODY)
def put(args, sha256):
    """Upload a pack for a pending version; the body must hash to `sha256`. The commit names its members.
    403 when another token created the version: only its creator uploads into it."""
    svc = services()
    return stored_answer(*content.put_pack(svc.db, svc.storage, digest_arg(sha256), args["version"], request.stream,
                                           token_id=auth.current().token_id))


@blp.route("/<sha256>", methods=["GET"])
@requires("read")
@blp.response(200, description="The pack's bytes; `Range` requests are answered with 206",
              content_type="application/octet-stream")
def get(sha256):
    """Download a pack, whole or a `Range` of it."""
    svc = services()
    pack = content.open_pack(svc.db, svc.storage, digest_arg(sha256))
    body = pack.local_file()
    if body is None:  # S3 with presigning off: the range is read from storage
        return _ranged(pack)
    resp = send_object(body, 0, conditional=True)  # sendfile; Range from the file
    metrics.current().bytes_out.labels("service").inc(resp.content_length or 0)
    return resp


def _ranged(pack: content.StoredPack) -> Response:
    size = pack.size()
    rng = request.range
    if rng is not None and len(rng.ranges) == 1:
        start, stop = rng.range_for_length(size) or (None, None)
        if start is None:
            return Response(status=416, headers={"Content-Range": f"bytes */{size}"})
        data = pack.read(start, stop - start)
        resp = Response(data, status=206, mimetype="application/octet-stream")
        resp.headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
    else:
        data = pack.read(0, size)
        resp = Response(data, mimetype="application/octet-stream")
    metrics.current().bytes_out.labels("service").inc(len(data))
    return resp
