"""Healing: a stored blob found bad later is forgotten, so the next publish that has it uploads it again.

A restoring client that finds a blob's bytes failing their sha256 (the manifest's, or the signed one)
reports it (``POST /api/v1/blobs/<sha256>/damaged``, read scope). The report is only a hint: the service
reads the stored bytes back itself (loose or in their pack, decoding bounded by the blob's size) and acts
only when they do not decode to the blob, so a false report (any read token can send one) changes
nothing but costs one read of the blob. A blob found bad has its row deleted (and its loose object: a
pack's other members keep theirs), under the blob's writer lock (``blobs.digest_lock``), checked again
there; from then on the index does not know it, so:

* resolve leaves it out of the answer (a restore names its files failed, as it did when their bytes
  were bad, and no longer downloads garbage);
* the next publish that names it is told to upload it (the create answer's ``upload``), and its bytes
  are checked before they are stored (``blobs.receive`` through the service, ``check_stored`` at commit
  for a presigned upload), as for any new blob; a restore after that gets the good bytes.

A remote-cache value is healed by its next PUT (``store_value``): the service has the value itself.
"""
from __future__ import annotations

import hashlib
import io
import logging
from typing import Optional

import zstandard
from sqlalchemy.orm import Session

from ..db import Database
from ..models import Blob
from ..storage import BlobNotFound, ShortObject, Storage, blob_key
from . import blobs, packs, reading
from ..storage.decoding import BadBlob, decode_all

log = logging.getLogger(__name__)


def damage(storage: Storage, blob: Blob) -> Optional[str]:
    """None when ``blob``'s stored bytes (loose or packed) decode to ``blob.size`` bytes hashing to
    ``blob.digest``; else what is wrong ("lost": the object is gone). Reads the blob once, streaming a loose
    object. Raises StorageError when storage fails (nothing is then decided)."""
    try:
        if blob.pack_digest is None:
            found = blobs.check_stored(storage, blob.digest, blob.encoding, blob.size)
            return None if found is not None else "lost"
        value = decode_all(packs.read_stored(storage, blob), blob.encoding, blob.size)
    except BlobNotFound:
        return "lost"
    except (BadBlob, ShortObject) as exc:
        return f"corrupt: {exc}"
    if len(value) != blob.size or hashlib.sha256(value).hexdigest() != blob.digest:
        return f"corrupt: its pack slice decodes to {len(value)} bytes of other content"
    return None


def reported_damaged(db: Database, storage: Storage, digest: str) -> dict:
    """Check blob ``digest`` that a client reported bad (see the module docstring): ``{"sha256", "status"}``,
    status ``intact`` (its stored bytes are right: nothing changed), ``forgotten`` (they were not: its row
    and loose object are gone, ``reason`` says why) or ``not_stored``. Raises StorageError."""
    with db.session() as s:
        blob = s.get(Blob, digest)
        if blob is None:
            return {"sha256": digest, "status": "not_stored"}
        s.expunge(blob)
    if damage(storage, blob) is None:  # read outside any transaction: a false report holds no lock
        return {"sha256": digest, "status": "intact"}
    with db.session() as s:
        blobs.digest_lock(s, digest)  # one writer of the blob: a concurrent store or repair finishes first
        blob = s.get(Blob, digest)
        if blob is None:
            return {"sha256": digest, "status": "not_stored"}
        why = damage(storage, blob)  # again, under the lock: the bytes may have been healed meanwhile
        if why is None:
            return {"sha256": digest, "status": "intact"}
        loose = blob.encoding if blob.pack_digest is None else None
        s.delete(blob)
        if loose is not None and why != "lost":
            storage.delete(blob_key(digest, loose))
    log.warning("blob %s was reported damaged and is %s; forgotten, the next publish naming it uploads it again",
                digest, why)
    return {"sha256": digest, "status": "forgotten", "reason": why}


def store_value(session: Session, storage: Storage, value: bytes, blob: Optional[Blob]) -> None:
    """Store ``value`` as its blob (zstd) unless ``blob``, its row (None: not stored), already holds it: a
    stored object lost or no longer decoding to the value is written again from ``value`` (``blobs.repair``,
    the same encoding), so the next PUT of a remote-cache value heals it. Raises StorageError."""
    if blob is not None and reading.read_value(storage, blob, len(value))[0] is not None:
        return
    digest = hashlib.sha256(value).hexdigest()
    encoding = blob.encoding if blob is not None else "zstd"
    body = zstandard.ZstdCompressor(level=3).compress(value) if encoding == "zstd" else value
    tmp, row = blobs.receive(storage, digest, encoding, io.BytesIO(body), len(value))
    if blob is None:
        blobs.store(session, storage, tmp, row)
    else:
        log.warning("remote cache: blob %s was lost or replaced in storage; stored again", digest)
        blobs.repair(session, storage, tmp, row)
