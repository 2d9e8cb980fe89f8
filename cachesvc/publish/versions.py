"""Publish in two steps, so a version is visible whole or not at all.

1. ``create_version``: the client sends its manifest; the service records a
   *pending* version and answers which blobs it lacks, with an upload target
   for each (a presigned S3 URL, or the service's own blob endpoint); or, when
   the client asks (``inline_targets`` false), just their sha256 and size, and
   hands out the targets in batches as the client uploads (``blob_targets``):
   at 100,000 files presigning them all took minutes and ~100 MB of answer.
2. ``commit_version``: once the client has uploaded, the service checks that
   every blob the version names is stored, then flips the version to
   *committed* in one transaction. Until then resolve never sees it. Large
   zstd blobs uploaded straight to storage are read back and decoded first
   (``cachesvc.content.check_stored``): one that does not decode to its sha256
   counts as missing, one that does gets its ``stored_sha256`` recorded.

Content equal to the key's newest committed version of the same kind creates no
version; content equal to another key's committed version is linked at once
(``cachesvc.publish.admission``); with ``merge`` the manifest is first unioned with
the key's newest version (``cachesvc.publish.merging``).
"""
from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from cachesvc_client.shared import keys

from . import admission, merging
from .. import content
from .. import lifecycle
from .. import index
from ..errors import BlobsMissing, Conflict, InvalidRequest, NotFound, PayloadTooLarge
from ..models import MAX_ID, Blob, Event, PendingPack, Version, VersionFile, utcnow
from ..storage.types import Storage
from ..config import Settings


def _check_manifest(files: List[dict], roots: Dict[str, str], max_files: int) -> Dict[str, int]:
    """Validate the manifest as a whole; return digest -> size."""
    if len(files) > max_files:
        raise PayloadTooLarge(f"{len(files)} files in one version; the limit is {max_files} (CACHESVC_MAX_FILES)")
    if not files:
        raise InvalidRequest("the manifest is empty: a version without files would hide the key's newest one; "
                             "publish after the compile has written its cache", {"field": "files"})
    seen = set()
    sizes: Dict[str, int] = {}
    for f in files:
        where = (f["root"], f["path"])
        if where in seen:
            raise InvalidRequest(f"duplicate path {f['root']}:{f['path']} in manifest")
        seen.add(where)
        if f["root"] not in roots:
            raise InvalidRequest(f"file {f['path']} names root {f['root']!r}, which is not in roots")
        if sizes.setdefault(f["sha256"], f["size"]) != f["size"]:
            raise InvalidRequest(f"sha256 {f['sha256']} is listed with two different sizes")
    for role, path in roots.items():
        if not path.startswith("/"):
            raise InvalidRequest(f"root {role!r} path {path!r} must be absolute")
    return sizes


def _audit(session: Session, actor: str, version: dict, new_stored_bytes: int, **details) -> None:
    """The audit record of a publish that made a committed version (``cachesvc.lifecycle.audit``)."""
    lifecycle.audit_record(session, "publish", actor, f"entry {version['entry_id']} version {version['id']}",
                           version["total_bytes"], {"entry_id": version["entry_id"], "version_id": version["id"],
                                                    "files": version["file_count"],
                                                    "new_stored_bytes": new_stored_bytes, **details})


def create_version(session: Session, storage: Storage, settings: Settings, body: dict, *, actor: str,
                   token_id: Optional[int] = None) -> Tuple[int, dict]:
    """Record a publish's manifest: (201, a pending version and the blobs to upload), or (200, the key's
    newest version when the content is the same, or a committed ``linked`` version when another key has
    it: audited as a publish by ``actor``). A pending version belongs to ``token_id`` (``check_creator``)."""
    key, files = body["key"], body["files"]
    sizes = _check_manifest(files, body["roots"], settings.MAX_FILES)
    lifecycle.store_lock(session)  # GC must see this pending version, or run wholly before it
    entry = index.find_entry(session, key["name"], key["shape"], key["tags"], key["env"], create=True)
    newest = index.newest_committed(session, entry.id, body["kind"])
    body = dict(body, meta=merging.without_base(body["meta"]))
    signed = index.signature_columns(body.get("signature"))
    # only directory snapshots are unioned, and never a signed one: its signature covers its own files
    if body.get("merge") and body["kind"] == keys.DEFAULT_KIND and not signed:
        files, body = merging.union(session, newest, body)
        sizes = _check_manifest(files, body["roots"], settings.MAX_FILES)
    digest = keys.manifest_digest(files)
    present = index.present_sizes(session, sizes)
    # a blob the index forgot (its stored bytes were found bad: cachesvc.content.healing) makes even the same
    # content a pending version, told to upload it; its commit then stores it and answers "unchanged"
    whole = len(present) == len(sizes)
    if whole and index.same_content(newest, digest, signed):
        return 200, {"status": "unchanged", "entry": index.entry_summary(entry),
                     "version": index.version_summary(newest), "upload": []}
    linked = admission.link(session, entry, body, files, digest, sizes) if whole else None
    if linked is not None:
        _audit(session, actor, linked[1]["version"], 0, linked_to=linked[1]["linked_to"]["version_id"])
        return linked

    for d, size in present.items():
        if size != sizes[d]:
            raise InvalidRequest(f"sha256 {d} is stored with size {size}, the manifest says {sizes[d]}")
    now = utcnow()
    version = Version(
        entry_id=entry.id, kind=body["kind"], state="pending", manifest_digest=digest,
        file_count=len(files), total_bytes=sum(f["size"] for f in files), roots=body["roots"],
        meta=body["meta"], compile_seconds=body["compile_seconds"], created_at=now,
        lease_expires_at=now + dt.timedelta(seconds=settings.UPLOAD_LEASE_SECONDS), restore_count=0,
        token_id=token_id, **signed,
    )
    session.add(version)
    session.flush()
    index.insert_version_files(session, version.id, files)
    upload = [{"sha256": d, "size": sizes[d]} for d in sorted(set(sizes) - set(present))]
    if body.get("inline_targets", True):  # a client from before batched targets
        expires = settings.PRESIGN_EXPIRES
        for item in upload:
            item["targets"] = content.upload_targets(storage, item["sha256"], item["size"], expires=expires,
                                                     version_id=version.id)
    return 201, {"status": "pending", "entry": index.entry_summary(entry),
                 "version": index.version_summary(version), "upload": upload, "packing": content.advertised()}


def blob_targets(session: Session, storage: Storage, settings: Settings, version_id: int,
                 digests: List[str], zstd_sizes: Optional[Dict[str, int]] = None) -> dict:
    """``{"targets": [{"sha256", "targets": {encoding: target}}], "stored": [sha256]}`` for blobs of a pending
    version: a target for each not stored yet (as the create answer would have listed inline; a zstd one
    presigned for the length ``zstd_sizes`` gives), ``stored`` for those a concurrent publish stored since
    (nothing to upload). Raises InvalidRequest for a blob the version does not name, or a zstd length for a
    blob not asked for or not smaller than it (the client keeps zstd only when it saves), Conflict when the
    upload lease has run out."""
    version = index.get_or_404(session, Version, version_id, "version")
    if version.state != "pending":
        raise InvalidRequest(f"version {version_id} is {version.state}; targets are for a pending version")
    if version.lease_expires_at and version.lease_expires_at < utcnow():
        raise Conflict(f"version {version_id} was not committed within its upload lease; publish again")
    wanted = list(dict.fromkeys(digests))
    named = dict(session.execute(select(VersionFile.digest, VersionFile.size).where(
        VersionFile.version_id == version_id, VersionFile.digest.in_(wanted))).all())
    if len(named) < len(wanted):
        odd = [d for d in wanted if d not in named]
        raise InvalidRequest(f"blob {odd[0]} is not a file of version {version_id}; ask only for the blobs its "
                             "create answer listed", {"field": "blobs", "blobs": odd[:100]})
    zstd_sizes = zstd_sizes or {}
    for d, length in zstd_sizes.items():
        if d not in named:
            raise InvalidRequest(f"zstd_sizes names blob {d}, which blobs does not", {"field": "zstd_sizes"})
        if length >= named[d]:
            raise InvalidRequest(f"zstd_sizes: {length} bytes of zstd for blob {d} of {named[d]} bytes; zstd is sent "
                                 "only when it is smaller", {"field": "zstd_sizes"})
    stored = set(index.present_sizes(session, wanted))
    expires = settings.PRESIGN_EXPIRES
    return {"targets": [{"sha256": d, "targets": content.upload_targets(storage, d, named[d], expires=expires,
                                                                        version_id=version_id,
                                                                        zstd_size=zstd_sizes.get(d))}
                        for d in wanted if d not in stored],
            "stored": sorted(stored)}


def _take_uploads(session: Session, storage: Storage, version_id: int, uploaded: List[dict],
                  packs: Optional[List[dict]]) -> int:
    """Check that every blob of pending version ``version_id`` is stored, loose or in one of ``packs``
    (verified first: ``cachesvc.content.verify_packs``), recording the blobs its uploads stored; returns
    the bytes those uploads put straight into storage. Raises BlobsMissing, InvalidRequest."""
    sizes = dict(session.execute(select(VersionFile.digest, VersionFile.size)
                                 .where(VersionFile.version_id == version_id).distinct()).all())
    packed = content.verify_packs(session, storage, version_id, packs or [], sizes)
    session.execute(delete(PendingPack).where(PendingPack.version_id == version_id))  # recorded now, or not needed
    needed = set(sizes) - set(index.present_sizes(session, sizes)) - {r["digest"] for r in packed}
    prefer = {u["sha256"]: u["encoding"] for u in uploaded}
    found, missing = [], []
    with ThreadPoolExecutor(max_workers=16) as pool:
        stats = pool.map(lambda d: (d, content.find_upload(storage, d, prefer.get(d), sizes[d], version_id)),
                         sorted(needed))
        for d, hit in stats:
            if hit is None:
                missing.append(d)
            else:
                found.append({"digest": d, "size": sizes[d], "stored_size": hit[1], "encoding": hit[0],
                              "stored_sha256": hit[2], "created_at": utcnow(), "incoming": hit[3]})
    if missing:
        raise BlobsMissing(f"{len(missing)} blob(s) of version {version_id} are not in storage; upload them and "
                           f"commit again", {"missing": missing[:1000]})
    direct_bytes = index.insert_blobs(session, content.place_uploads(session, storage, found))  # presigned uploads
    return direct_bytes + index.insert_blobs(session, packed)


def _pending_under_lock(session: Session, version_id: int) -> Tuple[Version, Optional[dict]]:
    """(the version, read again under its key's commit lock, None) while it may be committed; (it, the
    answer) when a concurrent commit of it (a retry) finished first. Raises NotFound, Conflict."""
    version = index.get_or_404(session, Version, version_id, "version")
    if version.state != "committed":
        index.lock_entry(session, version.entry_id)  # commits of one key, one at a time
        version = session.get(Version, version_id, populate_existing=True)
    if version is None:  # it held content equal to the newest version, and that commit dropped it
        raise NotFound(f"version {version_id} does not exist")
    if version.state == "committed":
        return version, {"status": "committed", "version": index.version_summary(version)}
    if version.lease_expires_at and version.lease_expires_at < utcnow():
        raise Conflict(f"version {version_id} was not committed within its upload lease; publish again")
    return version, None


def check_creator(session: Session, version_id: int, token_id: Optional[int]) -> None:
    """Forbidden unless ``token_id`` created pending version ``version_id`` (or no token did): another write
    token must not fetch its upload targets (and overwrite an upload in flight) or commit it."""
    version = session.get(Version, version_id) if 0 <= version_id <= MAX_ID else None  # beyond: commit's 404
    if version is not None:
        content.check_creator(version, token_id)  # the one rule, for the blob and pack PUTs too


def commit_version(session: Session, storage: Storage, version_id: int, uploaded: List[dict],
                   packs: Optional[List[dict]] = None, *, actor: str) -> Tuple[dict, int]:
    """Commit a pending version once every blob it names is stored (``_take_uploads``), audited as a
    publish by ``actor``. Returns (the answer, the bytes its uploads put straight into storage).
    Raises BlobsMissing, InvalidRequest, Conflict, NotFound."""
    lifecycle.store_lock(session)
    version, done = _pending_under_lock(session, version_id)
    if done is not None:
        return done, 0
    direct_bytes = _take_uploads(session, storage, version_id, uploaded, packs)
    content.clear_incoming(storage, version_id)
    merging.catch_up(session, version)
    if version.file_count == 0:  # recorded before empty manifests were refused
        raise InvalidRequest(f"version {version_id} has no files: a version without files would hide the key's "
                             "newest one; publish again after the compile has written its cache", {"field": "files"})
    newest = index.newest_committed(session, version.entry_id, version.kind)
    if index.same_content(newest, version.manifest_digest, index.signature_columns(
            {"public_key": version.signer_key, "signature": version.signature} if version.signature else None)):
        session.delete(version)  # a concurrent publisher committed the same content first
        return {"status": "unchanged", "version": index.version_summary(newest)}, direct_bytes
    version.state = "committed"
    version.committed_at = utcnow()
    version.commit_seq = index.next_commit_seq(session)
    version.lease_expires_at = None
    session.add(Event(kind="publish", entry_id=version.entry_id, version_id=version.id, bytes=version.total_bytes))
    session.flush()
    new_bytes = session.scalar(select(func.coalesce(func.sum(Blob.stored_size), 0))
                               .where(Blob.digest.in_(select(VersionFile.digest)
                                                      .where(VersionFile.version_id == version.id)),
                                      Blob.created_at >= version.created_at))
    answer = {"status": "committed", "version": index.version_summary(version)}
    _audit(session, actor, answer["version"], int(new_bytes))
    return answer, direct_bytes
