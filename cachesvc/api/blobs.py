"""Blob bytes through the service: used by the local backend (and S3 with presigning off)."""
from __future__ import annotations

import os
from typing import BinaryIO

from flask import Response, request, send_file

from .. import auth, content, metrics
from ..auth import requires
from ..schemas import BlobPutArgs, ErrorSchema
from .answers import BlobDamageSchema, BlobStoredSchema
from ..services import services
from . import BINARY_BODY, Blueprint, body_limit, digest_arg

OCTET_STREAM = "application/octet-stream"

blp = Blueprint("blobs", __name__, url_prefix="/api/v1/blobs", description="Content-addressed blob bytes")


@blp.route("/<sha256>", methods=["PUT"])
@requires("write")
@body_limit("MAX_BLOB_BYTES", streamed=True)
@blp.arguments(BlobPutArgs, location="query")
@blp.response(201, BlobStoredSchema)
@blp.alt_response(200, schema=BlobStoredSchema, description="A concurrent publish stored the blob since this version was created; the "
                                   "body was checked, nothing was written (`status: already_stored`)")
@blp.alt_response(409, schema=ErrorSchema, description="The blob was stored before this version was created: "
                                                        "stored blobs are never overwritten")
@blp.doc(requestBody=BINARY_BODY)
def put(args, sha256):
    """Upload a blob that a pending version was told to upload (`version`, as in its upload target); the
    body must decode to exactly the manifest's size and hash to `sha256`.

    403 when another token created the version (only its creator uploads into it), 400 when the body
    is not the blob (a body that decodes past the size is refused there), 409 `conflict` for a blob
    stored before the version was created: a stored blob's bytes never change.
    """
    svc = services()
    answer, wrote = content.put_blob(svc.db, svc.storage, digest_arg(sha256), args["encoding"], args.get("version"),
                                     request.stream, token_id=auth.current().token_id)
    return stored_answer(answer, wrote)


def stored_answer(answer: dict, wrote: bool):
    """201 and the bytes counted in when the PUT wrote them; 200 when a concurrent publish had."""
    if not wrote:
        return answer, 200
    metrics.current().bytes_in.labels("service").inc(answer["stored_size"])
    return answer


@blp.route("/<sha256>", methods=["GET"])
@requires("read")
@blp.response(200, description="The stored bytes; header X-Cachesvc-Encoding says how they are encoded",
              content_type="application/octet-stream")
def get(sha256):
    """Download a blob's stored bytes (zstd-framed when X-Cachesvc-Encoding is zstd)."""
    svc = services()
    stored = content.open_blob(svc.db, svc.storage, digest_arg(sha256))
    resp = send_object(stored.body, stored.length)
    resp.headers.update(stored.headers)
    metrics.current().bytes_out.labels("service").inc(stored.length)
    return resp


@blp.route("/<sha256>/damaged", methods=["POST"])
@requires("read", anonymous=False)
@blp.response(200, BlobDamageSchema)
def damaged(sha256):
    """Report that a blob's bytes failed their sha256 in a restore. The service reads its stored bytes back
    and checks them itself: when they do not decode to the blob it forgets it (`forgotten`: the next publish
    naming it uploads it again, checked), else nothing changes (`intact`). No body. A token is needed even
    where anonymous read is on: each report costs the service a read of the blob."""
    svc = services()
    return content.reported_damaged(svc.db, svc.storage, digest_arg(sha256))


def send_object(body: BinaryIO, length: int, conditional: bool = False) -> Response:
    """A response that streams storage object ``body`` and closes it. A local file goes by sendfile with its
    own size (answering ``Range`` requests when ``conditional``); another stream (S3) in 1 MiB reads, cut at
    the ``length`` bytes its row records, whatever the object holds now."""
    try:
        fileno = body.fileno()
    except OSError:  # io.UnsupportedOperation: not a file
        fileno = None
    if fileno is not None:
        try:
            resp = send_file(body, mimetype=OCTET_STREAM, conditional=False, etag=False)
            resp.content_length = os.fstat(fileno).st_size
            if conditional:
                resp = resp.make_conditional(request.environ, accept_ranges=True, complete_length=resp.content_length)
            return resp
        except BaseException:
            body.close()
            raise

    resp = Response(content.chunks(body, length), mimetype=OCTET_STREAM)
    resp.headers["Content-Length"] = str(length)
    return resp
