"""Content: blobs and packs, what the index knows of them, over the byte store (``cachesvc.storage``).

::

    blobs.py    a blob's bytes: received (PUT through the service), checked, stored once, never
                overwritten; read back at commit; whose PUT it is (the version's creator)
    packs.py    many small blobs in one object: upload targets, verification, ranged reads
    reading.py  serving what is stored: a blob (loose or its pack slice), a pack, a remote-cache value
    healing.py  a stored blob found bad: checked by the service and forgotten, so the next publish
                stores it again; a remote-cache value stored again by its next PUT
    uploads.py  a pending version's presigned uploads (for publish): targets in its incoming folder;
                at commit, which arrived (read back and checked), moved into place, the rest swept
    sweeping.py what GC (lifecycle) finds in storage and deletes: loose blobs, packs, presigned uploads

This module is the door: views (``cachesvc.api``) and services (publish, resolve, lifecycle, the remote
cache) call what it exports, and import of ``cachesvc.storage`` only its types (``storage.types``: the
``Storage`` they hand on, ``StorageError``), never its keys or its methods that read, write or delete
(``tests/test_layers.py``); ``cachesvc.storage`` knows bytes and keys only, and raises only its own
errors, which the reads here answer as the API's (404, 503).
"""
from __future__ import annotations

from ..storage.decoding import BadBlob
from .blobs import check_creator, check_stored, digest_lock
from .blobs import put as put_blob
from .healing import reported_damaged, store_value
from .packs import MAX_PACK, advertised, pack_url
from .packs import put as put_pack
from .packs import upload_targets as pack_targets
from .packs import verify as verify_packs
from .sweeping import (delete_blobs, delete_packs, delete_uploads, stored_blobs, stored_packs, sweep_received,
                       uploads_by_version)
from .uploads import find as find_upload, place as place_uploads, sweep as clear_incoming
from .uploads import targets as upload_targets
from .reading import Stored, StoredPack, blob_url, chunks, open_blob, open_pack, read_value, storage_failures


__all__ = ["BadBlob", "MAX_PACK", "Stored", "StoredPack", "advertised", "blob_url", "check_creator", "check_stored",
           "chunks", "clear_incoming", "delete_blobs", "delete_packs", "delete_uploads", "digest_lock", "find_upload",
           "open_blob", "open_pack", "pack_targets", "pack_url", "place_uploads", "put_blob", "put_pack", "read_value",
           "reported_damaged", "storage_failures", "store_value", "stored_blobs", "stored_packs", "sweep_received",
           "upload_targets", "uploads_by_version", "verify_packs"]
