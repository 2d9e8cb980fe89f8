"""Packs: many small blobs in one stored object, so a restore makes a few GETs instead of thousands.

A pack is the concatenation of its members' *stored* bytes (each member zstd
or identity, as a loose blob would be), stored at ``pack_key(<sha256 of the
pack>)``. The publisher builds them (``cachesvc_client.codec.packing``) from the
small blobs the service reported missing, uploads each like a blob (a
presigned PUT, or ``PUT /api/v1/packs/<sha256>`` through the service) and
names them in its commit with each member's ``sha256, offset, stored_size,
encoding, size``.

Commit verifies before it records (``verify``): it reads each pack once,
checks the pack's own sha256, decodes every member and checks its sha256 and
size; one bad member fails the whole commit with a 400 and records nothing.
A member becomes a ``blobs`` row with ``pack_digest`` / ``pack_offset``; a
blob already stored (loose or in another pack) keeps its row, so nothing is
ever packed twice. GC deletes a pack whole once no protecting version names
any of its members (``cachesvc.lifecycle.collect``).

A recorded pack's object is never written again: its upload target is the
service's own URL, never a presigned PUT (``upload_targets``), and a PUT of it
is checked and writes nothing (``claim``, ``store``). Members are decoded by
``cachesvc.storage.decoding``, bounded by their declared size.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, Dict, List, Optional, Tuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from . import blobs
from .. import index
from ..db import Database
from ..storage.decoding import BadBlob, decode_all
from ..errors import BlobsMissing, Conflict, InvalidRequest, PayloadTooLarge
from ..models import Blob, Pack, PendingPack, Version, utcnow
from ..storage import BlobNotFound, Storage, blob_key, incoming_key, pack_key

#: blobs smaller than this (decoded) are packed by the client
MAX_MEMBER = 256 << 10
#: packs are cut at this many stored bytes by the client
TARGET_PACK = 16 << 20
#: the largest pack the service accepts (the client's target plus one member, with room to spare)
MAX_PACK = 64 << 20
CHUNK = 1 << 20


def advertised() -> dict:
    """What the publish answer tells a client about packing (an older service says nothing: no packs)."""
    return {"max_member": MAX_MEMBER, "target_size": TARGET_PACK, "max_size": MAX_PACK}


def pack_url(storage: Storage, digest: str, expires: int) -> str:
    return storage.download_url(pack_key(digest), expires) or f"/api/v1/packs/{digest}"


def pending(session: Session, version: Version, digests: List[str]) -> None:
    """Record that ``version`` uploads packs ``digests`` (GC keeps their objects until it commits or
    dies). Raises InvalidRequest when the version is not pending, Conflict when its upload lease has
    run out (GC may be deleting it)."""
    if version.state != "pending":
        raise InvalidRequest(f"version {version.id} is {version.state}; packs are uploaded for a pending version")
    if version.lease_expires_at and version.lease_expires_at < utcnow():
        raise Conflict(f"version {version.id} was not committed within its upload lease; publish again")
    index.insert_ignore(session, PendingPack, [{"version_id": version.id, "digest": d} for d in digests])


def upload_targets(session: Session, storage: Storage, version_id: int, packs: List[dict], expires: int) -> List[dict]:
    """Where to PUT each pack of a pending version: ``[{"sha256", "target"}]``. A pack already recorded
    (committed by another publish of the same small blobs) gets the service's own URL, never a presigned
    one: that PUT checks the body and writes nothing, so a recorded pack's object is never overwritten."""
    pending(session, index.get_or_404(session, Version, version_id, "version"), [p["sha256"] for p in packs])
    recorded = set(session.scalars(select(Pack.digest).where(Pack.digest.in_([p["sha256"] for p in packs]))))
    out = []
    for p in packs:
        if p["size"] > MAX_PACK:
            raise PayloadTooLarge(f"pack {p['sha256']} is {p['size']} bytes; the limit is {MAX_PACK}")
        target = None if p["sha256"] in recorded else storage.upload_target(
            incoming_key(version_id, pack_key(p["sha256"])), expires, p["size"])  # moved into place at commit
        if target is None:
            target = {"method": "PUT", "url": f"/api/v1/packs/{p['sha256']}?version={version_id}", "headers": {}}
        out.append({"sha256": p["sha256"], "target": target})
    return out


def claim(session: Session, version: Version, digest: str) -> bool:
    """May pack ``digest`` be PUT for ``version``? True when it is recorded already (the PUT then writes
    nothing). Raises Conflict for a recorded pack the version was never given a target for, and what
    ``pending`` raises; records the pack as pending for the version otherwise."""
    if session.get(Pack, digest) is None:
        pending(session, version, [digest])
        return False
    asked = session.get(PendingPack, (version.id, digest)) is not None
    if not asked or version.state != "pending":
        raise Conflict(f"pack {digest} is stored already and stored packs are never overwritten; ask for its "
                       f"upload target (POST /api/v1/versions/{version.id}/packs) first")
    pending(session, version, [digest])  # the lease check
    return True


def receive(storage: Storage, digest: str, body: BinaryIO) -> Tuple[str, int]:
    """Stream ``body`` into a temp file and check that it hashes to ``digest``; return (the temp file, its
    size) for ``store``. Raises BadBlob (a 400), PayloadTooLarge, leaving no file."""
    tmp_dir = storage.temp_dir()
    fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix=".upload-pack-")
    sha, size = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in iter(lambda: body.read(CHUNK), b""):
                size += len(chunk)
                if size > MAX_PACK:
                    raise PayloadTooLarge(f"pack {digest} is over the {MAX_PACK}-byte limit")
                sha.update(chunk)
                out.write(chunk)
        if sha.hexdigest() != digest:
            raise BadBlob(f"body hashes to sha256 {sha.hexdigest()}, not {digest}; nothing was stored",
                          {"expected": digest, "actual": sha.hexdigest()})
    except BaseException:
        blobs.discard(tmp)
        raise
    return tmp, size


def put(db: Database, storage: Storage, digest: str, version_id: int, body: BinaryIO, *,
        token_id: Optional[int]) -> Tuple[dict, bool]:
    """A pack PUT through the service by ``token_id``, the creator of pending ``version_id`` (else Forbidden:
    ``blobs.check_creator``): recorded as pending for ``version_id`` before the bytes land (so GC
    cannot take them for an orphan; ``claim``), checked (``receive``), stored unless a commit recorded it
    meanwhile. Returns (the answer, whether bytes were written). Raises BadBlob, InvalidRequest, Forbidden,
    Conflict, PayloadTooLarge, StorageError."""
    with db.session() as s:
        version = s.get(Version, version_id)
        if version is None:
            raise InvalidRequest(f"version {version_id} is not a pending version; publish a manifest first")
        blobs.check_creator(version, token_id)
        recorded = claim(s, version, digest)
    tmp, size = receive(storage, digest, body)
    if recorded:
        blobs.discard(tmp)
    else:
        with db.session() as s:
            recorded = not store(s, storage, digest, tmp)
    if recorded:  # nothing written: a recorded pack's object never changes
        return {"sha256": digest, "stored_size": size, "status": "already_stored"}, False
    return {"sha256": digest, "stored_size": size, "status": "stored"}, True


def store(session: Session, storage: Storage, digest: str, tmp: str) -> bool:
    """Store a checked pack (``receive``) unless a commit recorded it meanwhile; True when this call wrote
    it. The temp file is consumed. Raises StorageError."""
    try:
        blobs.digest_lock(session, digest)
        if session.get(Pack, digest) is not None:
            return False
        storage.put_file(pack_key(digest), tmp)
        return True
    finally:
        blobs.discard(tmp)


def _check_layout(pack: dict, sizes: Dict[str, int]) -> None:
    """Members lie in order without overlap, and each is a blob of the version with its size."""
    end = 0
    for m in sorted(pack["members"], key=lambda m: m["offset"]):
        if m["offset"] < end:
            raise InvalidRequest(f"pack {pack['sha256']}: member {m['sha256']} overlaps the one before it")
        end = m["offset"] + m["stored_size"]
        if m["sha256"] not in sizes:
            raise InvalidRequest(f"pack {pack['sha256']}: member {m['sha256']} is not a file of this version")
        if m["size"] != sizes[m["sha256"]]:
            raise InvalidRequest(f"pack {pack['sha256']}: member {m['sha256']} is listed with size {m['size']}, "
                                 f"the manifest says {sizes[m['sha256']]}")
        if m["size"] > MAX_MEMBER or m["stored_size"] > MAX_PACK:
            raise InvalidRequest(f"pack {pack['sha256']}: member {m['sha256']} is too large to pack "
                                 f"(blobs of {MAX_MEMBER} bytes and more are uploaded loose)")


def _where(storage: Storage, version_id: int, digest: str) -> Tuple[Optional[str], Optional[int]]:
    """(key, size) of pack ``digest`` for a commit of ``version_id``: its presigned upload in the version's
    incoming folder, else the stored pack (uploaded through the service); (None, None) when neither is."""
    for key in (incoming_key(version_id, pack_key(digest)), pack_key(digest)):
        size = storage.stat(key)
        if size is not None:
            return key, size
    return None, None


def _verify_one(storage: Storage, version_id: int, pack: dict) -> Tuple[Optional[str], int]:
    """(None, the pack's size) when the pack is uploaded and every member checks out, after moving a
    presigned upload into place; else (what is wrong, 0), "missing" when the pack is not in storage.
    Reads the pack once."""
    digest = pack["sha256"]
    key, size = _where(storage, version_id, digest)
    if key is None:
        return "missing", 0
    if size > MAX_PACK:
        return f"pack {digest} is {size} bytes, over the {MAX_PACK}-byte limit", 0
    try:
        with storage.open(key) as body:
            data = body.read(size + 1)  # no more than the stat said (a read of n allocates n)
    except BlobNotFound:  # deleted since the stat
        return "missing", 0
    if len(data) != size:
        return f"pack {digest} changed in storage while it was read", 0
    if hashlib.sha256(data).hexdigest() != digest:
        return f"pack {digest}: the stored bytes do not hash to its name", 0
    problem = _check_members(data, pack)
    if problem is None and key != pack_key(digest):
        storage.promote(key, pack_key(digest))  # checked: its bytes are its name's, so a copy is harmless
    return problem, len(data)


def _check_members(data: bytes, pack: dict) -> Optional[str]:
    digest = pack["sha256"]
    for m in pack["members"]:
        end = m["offset"] + m["stored_size"]
        if end > len(data):
            return f"pack {digest}: member {m['sha256']} ends at {end}, past the pack's {len(data)} bytes"
        try:
            raw = decode_all(memoryview(data)[m["offset"]:end], m["encoding"], m["size"])
        except BadBlob as exc:
            return f"pack {digest}: member {m['sha256']} does not decode: {exc}"
        if len(raw) != m["size"] or hashlib.sha256(raw).hexdigest() != m["sha256"]:
            return (f"pack {digest}: member {m['sha256']} decodes to {len(raw)} bytes hashing to "
                    f"{hashlib.sha256(raw).hexdigest()}")
    return None


def verify(session: Session, storage: Storage, version_id: int, packs: List[dict],
           sizes: Dict[str, int]) -> List[dict]:
    """Check the version's packs (see the module docstring) and return the ``blobs`` rows of their members
    not stored yet; record the packs. Raises InvalidRequest on a bad pack or member (nothing recorded:
    the caller's transaction rolls back), BlobsMissing (``details.missing_packs``) when a pack is not
    in storage."""
    seen = set()
    for p in packs:
        if p["sha256"] in seen:
            raise InvalidRequest(f"pack {p['sha256']} is listed twice")
        seen.add(p["sha256"])
        _check_layout(p, sizes)
    members = [m["sha256"] for p in packs for m in p["members"]]
    if len(members) != len(set(members)):
        raise InvalidRequest("a blob is listed as a member of more than one pack, or twice in one")
    # A pack already recorded (the same bytes from another publisher) is read again all the same:
    # this commit's claims about where members lie in it are what is checked.
    with ThreadPoolExecutor(max_workers=4) as pool:
        checked = list(pool.map(lambda p: _verify_one(storage, version_id, p), packs))
    problems = [why for why, _size in checked]
    missing = [p["sha256"] for p, why in zip(packs, problems) if why == "missing"]
    bad = [why for why in problems if why not in (None, "missing")]
    if bad:
        raise InvalidRequest(f"{len(bad)} pack(s) failed verification; nothing was recorded: {bad[0]}",
                             {"problems": bad[:100]})
    if missing:
        raise BlobsMissing(f"{len(missing)} pack(s) are not in storage; upload them and commit again",
                           {"missing": [], "missing_packs": missing})
    now = utcnow()
    index.insert_ignore(session, Pack, [{"digest": p["sha256"], "stored_size": size, "created_at": now}
                                        for p, (_why, size) in zip(packs, checked)])
    present = set(index.present_sizes(session, members))
    return [{"digest": m["sha256"], "size": m["size"], "stored_size": m["stored_size"], "encoding": m["encoding"],
             "created_at": now, "pack_digest": p["sha256"], "pack_offset": m["offset"]}
            for p in packs for m in p["members"] if m["sha256"] not in present]


def read_stored(storage: Storage, blob: Blob) -> bytes:
    """A blob's stored bytes (encoded as ``blob.encoding``), loose or packed: the ``stored_size`` bytes its row
    records, never more. Raises BlobNotFound, StorageError; BadBlob when a loose object is not that long
    (replaced in storage)."""
    if blob.pack_digest is None:
        with storage.open(blob_key(blob.digest, blob.encoding)) as body:
            data = body.read(blob.stored_size + 1)
        if len(data) != blob.stored_size:
            how = "longer" if len(data) > blob.stored_size else "shorter"
            raise BadBlob(f"the object of blob {blob.digest} is {how} than the {blob.stored_size} bytes stored")
        return data
    return storage.read_range(pack_key(blob.pack_digest), blob.pack_offset, blob.stored_size)


def stored_somewhere(storage: Storage, blob: Blob) -> bool:
    """Whether the object holding ``blob`` exists (its own, or its pack)."""
    key = blob_key(blob.digest, blob.encoding) if blob.pack_digest is None else pack_key(blob.pack_digest)
    return storage.stat(key) is not None
