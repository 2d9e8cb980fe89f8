"""Publish: the only code that makes versions.

::

    POST /api/v1/versions           create_version  manifest -> admission (same content elsewhere: a linked
                                                    version at once) -> merge (the key's newest files the
                                                    manifest lacks) -> a pending version + the blobs to upload
    POST /api/v1/versions/<id>/uploads  blob_targets  upload targets in batches (presigned: the version's
                                                    incoming folder, cachesvc.content.upload_targets)
    (the client uploads: through the service, cachesvc.content.blobs/packs, or straight to S3)
    POST /api/v1/versions/<id>/commit   commit_version  every blob stored? packs verified, presigned uploads
                                                    checked and moved into place, the version committed
                                                    whole (newest = last committed), audited

``admission`` links content another key has, ``merging`` folds the key's other versions in. Bytes
are content's: publish finds, checks and places the uploads through ``cachesvc.content`` and imports
of ``cachesvc.storage`` only its types.
"""
from .versions import blob_targets, check_creator, commit_version, create_version

__all__ = ["blob_targets", "check_creator", "commit_version", "create_version"]
