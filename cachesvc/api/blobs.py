"""Blob bytes through the service: used by the local backend (and S3 with presigning off)."""
from __future__ import annotations

from flask import Response, request, send_file
from flask_smorest import Blueprint
from sqlalchemy import select

from .. import blobs, index, metrics, packs
from ..errors import InvalidRequest, NotFound, Unavailable
from ..models import Blob, Version, VersionFile
from ..schemas import BlobPutArgs
from ..storage import BlobNotFound, StorageError, blob_key
from ..auth import requires
from . import BINARY_BODY, digest_arg, services

blp = Blueprint("blobs", __name__, url_prefix="/api/v1/blobs", description="Content-addressed blob bytes")


@blp.route("/<sha256>", methods=["PUT"])
@requires("write")
@blp.arguments(BlobPutArgs, location="query")
@blp.response(201)
@blp.doc(requestBody=BINARY_BODY)
def put(args, sha256):
    """Upload a blob named in a pending version; the body must hash to `sha256` after decoding."""
    digest = digest_arg(sha256)
    svc = services()
    with svc.db.session() as s:
        wanted = s.execute(select(VersionFile.digest).join(Version, Version.id == VersionFile.version_id)
                           .where(VersionFile.digest == digest, Version.state == "pending").limit(1)).first()
        if wanted is None:
            raise InvalidRequest(f"blob {digest} is not named by any pending version; publish a manifest first")
    request.max_content_length = svc.settings["MAX_BLOB_BYTES"]
    try:
        row = blobs.receive(svc.storage, digest, args["encoding"], request.stream)
    except StorageError as exc:
        raise Unavailable(f"blob storage failed: {exc}") from None
    with svc.db.session() as s:
        index.insert_blobs(s, [row])
    metrics.current().bytes_in.labels("service").inc(row["stored_size"])
    return {"sha256": digest, "size": row["size"], "stored_size": row["stored_size"], "encoding": row["encoding"]}


@blp.route("/<sha256>", methods=["GET"])
@requires("read")
@blp.response(200, description="The stored bytes; header X-Cachesvc-Encoding says how they are encoded",
              content_type="application/octet-stream")
def get(sha256):
    """Download a blob's stored bytes (zstd-framed when X-Cachesvc-Encoding is zstd)."""
    digest = digest_arg(sha256)
    svc = services()
    with svc.db.session() as s:
        blob = s.get(Blob, digest)
        if blob is None:
            raise NotFound(f"blob {digest} is not stored")
        encoding, size, stored = blob.encoding, blob.size, blob.stored_size
        s.expunge(blob)
    key = blob_key(digest, encoding)
    headers = {"X-Cachesvc-Encoding": encoding, "X-Cachesvc-Size": str(size)}
    path = svc.storage.local_path(key)
    try:
        if blob.pack_digest is not None:  # a slice of its pack (older clients know only this URL)
            resp = Response(packs.read_stored(svc.storage, blob), mimetype="application/octet-stream")
        elif path is not None:
            resp = send_file(path, mimetype="application/octet-stream", conditional=False, etag=False)
        else:
            body = svc.storage.open(key)
            resp = Response(iter(lambda: body.read(1 << 20), b""), mimetype="application/octet-stream")
            resp.headers["Content-Length"] = str(stored)
    except (FileNotFoundError, BlobNotFound):
        raise NotFound(f"blob {digest} is indexed but missing from storage") from None
    except StorageError as exc:
        raise Unavailable(f"blob storage failed: {exc}") from None
    resp.headers.update(headers)
    metrics.current().bytes_out.labels("service").inc(stored)
    return resp
