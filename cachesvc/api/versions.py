"""Publish: create a pending version, then commit it."""
from __future__ import annotations

from flask_smorest import Blueprint

from .. import index, publishing
from ..models import Version, VersionFile
from ..schemas import CommitSchema, PublishSchema
from . import services

blp = Blueprint("versions", __name__, url_prefix="/api/v1/versions", description="Publish versions of a cache entry")


@blp.route("", methods=["POST"])
@blp.arguments(PublishSchema)
@blp.response(201)
@blp.alt_response(200, description="Content equals the key's newest version; nothing to upload")
def create(body):
    """Start a publish: record the manifest and answer which blobs to upload.

    Returns status `pending` with an upload target per missing blob, or
    `unchanged` when the content equals the key's newest committed version.
    """
    svc = services()
    with svc.db.session() as s:
        status, result = publishing.create_version(s, svc.storage, svc.settings, body)
    return result, status


@blp.route("/<int:version_id>/commit", methods=["POST"])
@blp.arguments(CommitSchema)
@blp.response(200)
def commit(body, version_id):
    """Make a pending version visible, once every blob it names is stored (409 `blobs_missing` otherwise)."""
    svc = services()
    with svc.db.session() as s:
        return publishing.commit_version(s, svc.storage, version_id, body["uploaded"])


@blp.route("/<int:version_id>", methods=["GET"])
@blp.response(200)
def get(version_id):
    """A version with its file list."""
    svc = services()
    with svc.db.session() as s:
        v = index.get_or_404(s, Version, version_id, "version")
        out = index.version_summary(v)
        out["files"] = [{"root": f.root, "path": f.path, "sha256": f.digest, "size": f.size, "mode": f.mode}
                        for f in s.query(VersionFile).filter_by(version_id=v.id).order_by(VersionFile.root,
                                                                                         VersionFile.path)]
        return out
