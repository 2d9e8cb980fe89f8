"""Presigned uploads of a pending version's blobs, for ``cachesvc.publish``: where to PUT them, and at
commit, which arrived, checked, moved into place, and what is left swept.

A presigned PUT lands in the version's own incoming folder (``cachesvc.storage.incoming_key``), never at
a stored blob's key: a presigned URL stays valid for ``PRESIGN_EXPIRES`` after its version commits, so
only commit, after reading the upload back, moves it to the blob's key (``place``). GC deletes what no
commit takes (``cachesvc.content.sweeping``).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

from sqlalchemy.orm import Session

from . import blobs
from .. import index
from ..storage import ENCODINGS, Storage, blob_key, incoming_key


def targets(storage: Storage, digest: str, size: int, *, expires: int, version_id: int,
            zstd_size: Optional[int] = None) -> Dict[str, dict]:
    """Where to PUT blob ``digest`` for pending version ``version_id``, per encoding. A presigned target (into the
    version's incoming folder: commit checks the upload there and moves it into place, GC deletes what no commit
    takes) signs its body's length, so storage refuses any other: the identity target the blob's size, the zstd
    target ``zstd_size``, the length the client states once it has compressed. Without one, the zstd target is
    the service's own URL (it reads and checks the body), marked ``needs_size``. Where storage presigns nothing
    (the local backend, or presigning off) both targets are the service's own."""
    def presigned(encoding: str, length: int) -> Optional[dict]:
        return storage.upload_target(incoming_key(version_id, blob_key(digest, encoding)), expires, length)

    def through_service(encoding: str) -> dict:
        return {"method": "PUT", "url": f"/api/v1/blobs/{digest}?encoding={encoding}&version={version_id}",
                "headers": {}}

    identity = presigned("identity", size)
    if identity is None:
        return {enc: through_service(enc) for enc in ENCODINGS}
    zstd = presigned("zstd", zstd_size) if zstd_size else dict(through_service("zstd"), needs_size=True)
    return {"identity": identity, "zstd": zstd}


def find(storage: Storage, digest: str, prefer: Optional[str], size: int,
         version_id: int) -> Optional[Tuple[str, int, Optional[str], str]]:
    """(encoding, stored size, stored sha256 or None, incoming key) of a blob version ``version_id``
    uploaded by a presigned PUT (``incoming_key``); None when it is not there, or not a valid encoding
    of the blob.

    Every upload is read back and decoded, whatever its size: a presigned URL pins neither the bytes nor
    (for zstd) the length, so an object of the right size could be anything (another write token's
    same-size garbage, claiming the digest for good). One that does not decode to the blob is deleted,
    so the publisher's next upload starts clean."""
    order = [prefer] if prefer else []
    order += [e for e in ENCODINGS if e != prefer]
    for enc in order:
        staged = incoming_key(version_id, blob_key(digest, enc))
        stored = storage.stat(staged)
        if stored is None or (enc == "identity" and stored != size):
            continue  # absent, or an identity upload of the wrong length: not this blob
        try:
            stored_sha = blobs.check_stored(storage, digest, enc, size, key=staged)
        except blobs.BadBlob:
            storage.delete(staged)
            continue
        if stored_sha is not None:
            return enc, stored, stored_sha, staged
    return None


def place(session: Session, storage: Storage, found: List[dict]) -> List[dict]:
    """Move the checked presigned uploads ``found`` (rows with ``incoming``, the key ``find`` gave) to their
    blobs' keys, one writer per blob (``blobs.digest_lock``, in digest order); a blob a concurrent commit stored
    since keeps its object and row, and this version's upload of it is dropped. Returns the rows to record."""
    for row in sorted(found, key=lambda r: r["digest"]):
        blobs.digest_lock(session, row["digest"])
    stored = set(index.present_sizes(session, [r["digest"] for r in found]))
    placed = [r for r in found if r["digest"] not in stored]

    def move(row: dict) -> None:
        staged = row.pop("incoming")
        if row["digest"] in stored:
            storage.delete(staged)
        else:
            storage.promote(staged, blob_key(row["digest"], row["encoding"]))

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(move, found))
    return placed


def sweep(storage: Storage, version_id: int) -> None:
    """Delete what is left in the version's incoming folder once its uploads are taken: the other
    encoding of a blob, uploads past a blob's size, anything PUT to its targets that it did not use."""
    for k in list(storage.iter_keys(incoming_key(version_id, ""))):
        storage.delete(k)
