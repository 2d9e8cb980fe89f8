"""Content: blobs and packs, what the index knows of them, over the byte store (``cachesvc.storage``).

::

    blobs.py    a blob's bytes: received (PUT through the service), checked, stored once, never
                overwritten; read back at commit; whose PUT it is (the version's creator)
    packs.py    many small blobs in one object: upload targets, verification, ranged reads
    reading.py  serving what is stored: a blob (loose or its pack slice), a pack, a remote-cache value
    healing.py  a stored blob found bad: checked by the service and forgotten, so the next publish
                stores it again; a remote-cache value stored again by its next PUT

This module is the door: views (``cachesvc.api``) and services (publish, resolve, the remote cache) call
what it exports, never ``cachesvc.storage`` for blobs or packs; ``cachesvc.storage`` knows bytes and
keys only, and raises only its own errors, which the reads here answer as the API's (404, 503).
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
from .reading import Stored, StoredPack, blob_url, chunks, open_blob, open_pack, read_value, storage_failures


__all__ = ["BadBlob", "MAX_PACK", "Stored", "StoredPack", "advertised", "blob_url", "check_creator", "check_stored",
           "chunks", "digest_lock", "open_blob", "open_pack", "pack_targets", "pack_url", "put_blob", "put_pack",
           "read_value", "reported_damaged", "storage_failures", "store_value", "verify_packs"]
