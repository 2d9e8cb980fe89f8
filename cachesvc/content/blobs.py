"""Receive and check blob bytes: the body of a PUT through the service, or an object uploaded
straight to storage (presigned) and read back at commit.

A body is streamed to a temp file while its sha256 is computed over the
*decoded* bytes, decoded by ``cachesvc.storage.decoding`` (bounded by the manifest's
size); only a body whose digest matches is handed to storage, so a bad upload
leaves nothing behind (validate first, then write). A zstd body may be
several concatenated frames (large blobs are published that way so that
restores decode them in parallel); every frame is decoded.

Stored bytes never change: a PUT is accepted only for a blob its pending
version was told to upload (``claim``), and the object is written only while
no row exists, under a lock per blob (``store``), so a row always describes
the object's bytes. The one writer of a stored blob's object is the service
itself, healing an object found lost or replaced (``repair``).

Having decoded the stored bytes itself, the service records their own sha256
(``stored_sha256``): a restoring client that finds the stored bytes hash to it
knows they decode to the blob without hashing the decoded bytes (docs/security.md,
"Security").
"""
from __future__ import annotations

import datetime as dt
import hashlib
import os
import tempfile
from typing import BinaryIO, Optional, Tuple

from sqlalchemy import or_, select, text, update
from sqlalchemy.orm import Session

from .. import index
from ..db import Database
from ..storage.decoding import BadBlob, Decode  # BadBlob is raised through this module's API too
from ..errors import Conflict, Forbidden, InvalidRequest
from ..models import Blob, Version, VersionFile, utcnow
from ..storage import BlobNotFound, Storage, blob_key

#: a blob this large (decoded) is "large" to the tests of decoding at commit; every object uploaded
#: straight to storage is read back and checked at commit whatever its size (uploads.find)
VERIFY_AT_COMMIT_MIN = 8 << 20
#: a blob stored less than this before a pending version was created may still have been missing when the
#: version was told what to upload (its row is stamped just before its transaction commits; the clocks of
#: service hosts differ a little): that version's PUT is answered "already stored", not refused. Either
#: way nothing is written.
RACE_SLACK = dt.timedelta(seconds=2)
#: the first key of the PostgreSQL advisory locks that serialise the writers of one blob (``digest_lock``)
_DIGEST_LOCK_SPACE = 0x626C6F62  # "blob"


class _Check:
    """Decode a stored stream (``cachesvc.storage.decoding``: it stops one byte past ``size``, the blob's declared
    decoded size), hashing the stored bytes and the decoded ones, and passing each stored chunk on to
    ``sink`` (a temp file's write, or nothing)."""

    def __init__(self, body: BinaryIO, encoding: str, size: int, sink=lambda chunk: None):
        self.stored_sha, self.sha, self.sink = hashlib.sha256(), hashlib.sha256(), sink
        self.decode, self.declared = Decode(body, encoding, size, self._stored), size

    def _stored(self, chunk: bytes) -> None:
        self.stored_sha.update(chunk)
        self.sink(chunk)

    def run(self, digest: str, encoding: str) -> dict:
        for piece in self.decode:
            self.sha.update(piece)
        size = self.decode.size
        if size != self.declared:
            raise BadBlob(f"body decodes to {size} bytes, the manifest says {self.declared}; nothing was stored",
                          {"declared_size": self.declared, "size": size})
        if self.sha.hexdigest() != digest:
            raise BadBlob(f"body hashes to sha256 {self.sha.hexdigest()}, not {digest}; nothing was stored",
                          {"expected": digest, "actual": self.sha.hexdigest()})
        return {"digest": digest, "size": size, "stored_size": self.decode.stored, "encoding": encoding,
                "stored_sha256": self.stored_sha.hexdigest()}


def receive(storage: Storage, digest: str, encoding: str, body: BinaryIO, size: int) -> Tuple[str, dict]:
    """Stream ``body`` into a temp file beside storage and check that it is ``encoding`` of blob ``digest``
    (``size`` decoded bytes; decoding stops one byte past it). Returns (the temp file, the blob's row
    values): the caller stores it (``store``) or deletes it. Raises BadBlob (a 400), leaving no file."""
    tmp_dir = storage.temp_dir()
    fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix=".upload-")
    try:
        with os.fdopen(fd, "wb") as out:
            return tmp, _Check(body, encoding, size, out.write).run(digest, encoding)
    except BaseException:
        discard(tmp)
        raise


def put(db: Database, storage: Storage, digest: str, encoding: str, version_id: Optional[int],
        body: BinaryIO, *, token_id: Optional[int]) -> Tuple[dict, bool]:
    """A blob PUT through the service by ``token_id``: may it be written (``claim``)? Then the body checked
    (``receive``) and stored, unless a concurrent publish stored it first. Returns (the answer, whether
    bytes were written). Raises BadBlob, InvalidRequest, Forbidden, Conflict, StorageError."""
    with db.session() as s:
        size, stored = claim(s, digest, version_id, token_id)
    tmp, row = receive(storage, digest, encoding, body, size)
    if stored is None:
        with db.session() as s:
            stored = store(s, storage, tmp, row)
    else:
        discard(tmp)
    if stored is not None:  # nothing written: the stored bytes stay as they are
        return {"sha256": digest, "size": stored.size, "stored_size": stored.stored_size,
                "encoding": stored.encoding, "status": "already_stored"}, False
    return {"sha256": digest, "size": row["size"], "stored_size": row["stored_size"], "encoding": row["encoding"],
            "status": "stored"}, True


def discard(tmp: str) -> None:
    """Remove a temp file of ``receive`` that was not stored (``put_file`` consumes the ones that are)."""
    if os.path.exists(tmp):
        os.unlink(tmp)


def digest_lock(session: Session, digest: str) -> None:
    """Serialise, until ``session`` commits, the writers of blob ``digest``'s object and row (PostgreSQL: an
    advisory lock of its own key space; SQLite: the database's write lock, which serialises all writers)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(CAST(:space AS integer), CAST(:key AS integer))"),
                        {"space": _DIGEST_LOCK_SPACE, "key": int(digest[:7], 16)})
    else:
        session.execute(text("UPDATE blobs SET digest = digest WHERE 1 = 0"))


def store(session: Session, storage: Storage, tmp: str, row: dict) -> Optional[Blob]:
    """Store a checked upload (``receive``) as its blob unless the blob is stored by now; None when this
    call stored it, else the stored blob (its object and row untouched: stored bytes never change).
    The temp file is consumed either way. Raises StorageError."""
    try:
        digest_lock(session, row["digest"])
        stored = session.get(Blob, row["digest"])
        if stored is not None:
            return stored
        storage.put_file(blob_key(row["digest"], row["encoding"]), tmp)
        index.insert_blobs(session, [{**row, "created_at": utcnow()}])  # stamped under the lock: see claim()
        return None
    finally:
        discard(tmp)


def repair(session: Session, storage: Storage, tmp: str, row: dict) -> None:
    """Make a checked upload (``receive``) the object of blob ``row["digest"]``, whose object (or pack) was
    found lost or no longer decoding to the blob, and point its row at it. Only the service calls this, with
    bytes it encoded itself from content whose sha256 it checked. The temp file is consumed. Raises
    StorageError."""
    try:
        digest_lock(session, row["digest"])
        storage.put_file(blob_key(row["digest"], row["encoding"]), tmp)
        session.execute(update(Blob).where(Blob.digest == row["digest"]).values(
            encoding=row["encoding"], stored_size=row["stored_size"], stored_sha256=row["stored_sha256"],
            pack_digest=None, pack_offset=None))
    finally:
        discard(tmp)


def check_creator(version: Version, token_id: Optional[int]) -> None:
    """Forbidden unless ``token_id`` created pending ``version`` (or no token did): only the creator uploads
    into it, through the service as through presigned targets (``cachesvc.publish.check_creator``)."""
    if version.state == "pending" and version.token_id is not None and version.token_id != token_id:
        raise Forbidden(f"version {version.id} was created by another token: only that token uploads to it "
                        "and commits it; publish with your own")


def claim(session: Session, digest: str, version_id: Optional[int], token_id: Optional[int]
          ) -> Tuple[int, Optional[Blob]]:
    """May blob ``digest`` be PUT by ``token_id`` for pending version ``version_id`` (None: any pending
    version of that token naming it)? Only the version's creator may (``check_creator``: Forbidden).

    Returns (its decoded size in the manifest, the blob when it is stored already). A stored blob is
    never written again: the PUT is refused with Conflict when the blob was stored before the version
    was created (so the version was never asked to upload it), and is answered without writing when a
    concurrent publish stored it since (``RACE_SLACK``). Raises InvalidRequest when no such version
    names the blob, Conflict when the version's upload lease has run out.
    """
    q = (select(VersionFile.size, Version).join(Version, Version.id == VersionFile.version_id)
         .where(VersionFile.digest == digest, Version.state == "pending"))
    if version_id is not None:
        q = q.where(Version.id == version_id)
    else:  # an older client names no version: the token's own, else another's (refused below)
        own = q.where(or_(Version.token_id.is_(None), Version.token_id == token_id))
        q = own if session.execute(own.limit(1)).first() is not None else q
    found = session.execute(q.order_by(Version.id.desc()).limit(1)).first()
    if found is None:
        where = f"pending version {version_id}" if version_id is not None else "any pending version"
        raise InvalidRequest(f"blob {digest} is not named by {where}; publish a manifest first")
    size, version = found
    check_creator(version, token_id)
    if version.lease_expires_at and version.lease_expires_at < utcnow():
        raise Conflict(f"version {version.id} was not committed within its upload lease; publish again")
    blob = session.get(Blob, digest)
    if blob is not None and (version_id is None or blob.created_at < version.created_at - RACE_SLACK):
        raise Conflict(f"blob {digest} is already stored and stored blobs are never overwritten; version "
                       f"{version.id} was not asked to upload it (only blobs missing at publish are)",
                       {"sha256": digest, "stored_size": blob.stored_size, "encoding": blob.encoding})
    return size, blob


def check_stored(storage: Storage, digest: str, encoding: str, size: int, *, key: Optional[str] = None
                 ) -> Optional[str]:
    """Read blob ``digest`` back from storage (its object, or the object at ``key``: an upload in its
    incoming place) and check that it decodes to ``digest`` (``size`` bytes; decoding stops one byte
    past it).

    Returns the sha256 of the stored bytes; None when the object is gone.
    Raises BadBlob when it does not decode to the blob, StorageError when
    storage fails.
    """
    try:
        with storage.open(key or blob_key(digest, encoding)) as body:
            return _Check(body, encoding, size).run(digest, encoding)["stored_sha256"]
    except BlobNotFound:
        return None
