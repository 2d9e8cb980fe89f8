"""Publish: create a pending version, then commit it."""
from __future__ import annotations

from cachesvc_client.shared import keys

from .. import auth, content, index, lifecycle, metrics, publish
from ..auth import requires
from ..models import Version, VersionFile
from ..schemas import CommitSchema, PackTargetsSchema, PublishSchema, UploadTargetsSchema
from .answers import BlobUploadTargetsSchema, PackUploadTargetsSchema
from .version_answers import CommitAnswerSchema, PublishAnswerSchema, VersionDetailSchema
from ..services import services
from . import Blueprint, body_limit, json_limit

#: the largest requests PackTargetsSchema and UploadTargetsSchema take (their list bounds, the largest values)
LARGEST_PACK_TARGETS = {"packs": [{"sha256": "f" * 64, "size": 2**40}] * 10_000}
LARGEST_UPLOAD_TARGETS = {"blobs": ["f" * 64] * 1000, "zstd_sizes": {f"{n:064x}": keys.MAX_FILE_SIZE for n in range(1000)}}

blp = Blueprint("versions", __name__, url_prefix="/api/v1/versions", description="Publish versions of a cache entry")


@blp.route("", methods=["POST"])
@requires("write")
@body_limit("MAX_REQUEST_BYTES")
@blp.arguments(PublishSchema)
@blp.response(201, PublishAnswerSchema)
@blp.alt_response(200, schema=PublishAnswerSchema,
                  description="Content equals the key's newest version (`unchanged`) or another key's "
                              "(`linked`); nothing to upload")
def create(body):
    """Start a publish: record the manifest and answer which blobs to upload.

    Returns status `pending` with an upload target per missing blob;
    `unchanged` when the content equals the key's newest committed version;
    `linked` when it equals another key's committed version: this key gets a
    committed version of the same files at once, nothing to upload. With
    `merge`, the key's newest version's files at other paths join the manifest.
    """
    svc = services()
    with svc.db.session() as s:
        status, result = publish.create_version(s, svc.storage, svc.settings, body,
                                                actor=lifecycle.request_actor(), token_id=auth.current().token_id)
    return result, status


@blp.route("/<int:version_id>/commit", methods=["POST"])
@requires("write")
@body_limit("MAX_REQUEST_BYTES")
@blp.arguments(CommitSchema)
@blp.response(200, CommitAnswerSchema)
def commit(body, version_id):
    """Make a pending version visible, once every blob it names is stored (409 `blobs_missing` otherwise)."""
    svc = services()
    with svc.db.session() as s:
        publish.check_creator(s, version_id, auth.current().token_id)
        result, direct_bytes = publish.commit_version(s, svc.storage, version_id, body["uploaded"], body["packs"],
                                                      actor=lifecycle.request_actor())
    metrics.current().bytes_in.labels("storage").inc(direct_bytes)  # uploaded straight to storage (presigned)
    return result


@blp.route("/<int:version_id>/packs", methods=["POST"])
@requires("write")
@body_limit(json_limit(LARGEST_PACK_TARGETS))
@blp.arguments(PackTargetsSchema)
@blp.response(200, PackUploadTargetsSchema)
def pack_targets(body, version_id):
    """Upload targets for the packs of a pending version (see `packing` in the publish answer): one
    `{sha256, target}` per pack, the target a presigned PUT or `PUT /api/v1/packs/<sha256>`."""
    svc = services()
    with svc.db.session() as s:
        publish.check_creator(s, version_id, auth.current().token_id)
        return {"targets": content.pack_targets(s, svc.storage, version_id, body["packs"],
                                                  svc.settings.PRESIGN_EXPIRES)}


@blp.route("/<int:version_id>/uploads", methods=["POST"])
@requires("write")
@body_limit(json_limit(LARGEST_UPLOAD_TARGETS))
@blp.arguments(UploadTargetsSchema)
@blp.response(200, BlobUploadTargetsSchema)
def blob_targets(body, version_id):
    """Upload targets for blobs of a pending version (a publish created with `inline_targets: false`): one
    `{sha256, targets: {identity, zstd}}` per blob not stored yet, each target a presigned PUT or
    `PUT /api/v1/blobs/<sha256>`; `stored` lists those stored since the create (nothing to upload). A
    presigned target takes a body of one length: the blob's size (identity), or the zstd body's length
    given in `zstd_sizes`."""
    svc = services()
    with svc.db.session() as s:
        publish.check_creator(s, version_id, auth.current().token_id)
        return publish.blob_targets(s, svc.storage, svc.settings, version_id, body["blobs"], body["zstd_sizes"])


@blp.route("/<int:version_id>", methods=["GET"])
@requires("read")
@blp.response(200, VersionDetailSchema)
def get(version_id):
    """A version with its file list."""
    svc = services()
    with svc.db.session() as s:
        v = index.get_or_404(s, Version, version_id, "version")
        out = index.version_summary(v)
        out["files"] = [index.file_row(f)
                        for f in s.query(VersionFile).filter_by(version_id=v.id).order_by(VersionFile.root,
                                                                                         VersionFile.path)]
        return out
