"""Purge and garbage collection, and why a restore in flight never breaks.

Life of a version::

    pending --commit--> committed --purge--> purged --GC after the grace--> row deleted
    pending --upload lease expires--> row deleted by GC (commit refuses it already)

**Purge** only marks committed versions ``purged`` (soft delete): resolve stops
offering them at once, but their rows, file lists and blobs stay.

**GC** deletes a blob (its storage object and its row) only when no
*protecting* version names it. Protecting versions are

* committed versions;
* pending versions whose upload lease (plus ``LEASE_MARGIN`` for clock skew
  between workers) has not run out: a publish in flight announced the blob
  and may be uploading it right now;
* purged versions purged less than ``GC_GRACE_SECONDS`` ago. A restore that
  resolved a version just before the purge holds URLs for its blobs: a
  presigned URL lives ``PRESIGN_EXPIRES`` seconds, and ``/api/v1/blobs`` serves
  a blob while its row exists. The default grace, ``PRESIGN_EXPIRES`` + 1 h,
  outlives every URL handed out for the version and the restore using it.

GC first deletes the rows of versions that no longer protect (expired
pending ones, purged ones past the grace) and entries left without versions;
every version left then protects, so a blob is collectable exactly when no
``version_files`` row and no live remote-cache item names it (items idle for
``REMOTE_CACHE_MAX_IDLE_DAYS`` are evicted first).

**Packs** (``cachesvc.content.packs``) go whole: a pack, its row and its members' blob
rows are deleted once none of its members is named by a version or a
remote-cache item. A partly live pack stays as it is, dead members included,
and those members stay indexed, so a later publish of one finds it stored.
Purge's ``bytes_freed`` and ``max_total_bytes`` count a packed blob by its
share of the pack (its stored bytes), so a partly live pack counts as its
live members. A pack has no row until the commit that verifies it; while its
version is pending, a ``pending_packs`` row (made when the version asks for an
upload target, or when the pack is PUT through the service) keeps the sweep
of storage off it. Pack objects with neither row (uploads of publishes that
died, once their versions are dropped; failed deletes) are swept.

**Serialisation.** ``create_version``, ``commit_version`` and purge take the
*store lock* (``store_lock``) first thing; GC takes it exclusively for each
batch. A publish therefore runs wholly before a GC batch (its pending version
then protects its blobs) or wholly after it (the blob rows GC removed are
absent, so the service asks for the upload again). On PostgreSQL the lock is
an advisory lock: shared for publishes, exclusive for purge, and held by GC
on its own connection across "delete the rows, commit, delete the objects",
so a failed object delete only leaves an orphan object without a row, which
the next GC's sweep of storage removes. On SQLite the lock is the database's
write lock, and a batch deletes its objects before its transaction commits.

Functions here take a ``Database`` or a ``Session`` and are safe to run from
several processes at once.
"""
from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from typing import Callable, Dict, List, Optional, Tuple

from sqlalchemy import delete, exists, func, or_, select, update
from sqlalchemy.orm import Session, selectinload

from .. import content, index
from ..db import Database
from ..errors import InvalidRequest
from ..models import Blob, Entry, Event, Pack, PendingPack, RemoteCacheItem, Version, VersionFile, utcnow
from ..storage.types import Storage
from ..config import Settings
from .locks import gc_lock as _gc_lock, sqlite_write_lock as _sqlite_write_lock, store_lock

#: pending versions stay protected this long past their lease (clock skew between workers, slow commits)
LEASE_MARGIN = dt.timedelta(seconds=120)
_BATCH = 500

CRITERIA = ("not_restored_for", "older_than", "keep_latest", "torch_version", "name", "device", "max_total_bytes")
#: criteria that name one version or one entry by id (the pages' purge buttons); not flags of the CLI
TARGETS = ("version_id", "entry_id")


# -- purge -----------------------------------------------------------------------------

def check_criteria(criteria: dict) -> dict:
    """The criteria that were given (None values dropped); InvalidRequest when there are none."""
    given = {k: v for k, v in criteria.items() if k in CRITERIA + TARGETS and v is not None}
    if not given:
        raise InvalidRequest(f"a purge needs at least one criterion: {', '.join(CRITERIA)}",
                             {"one_of": list(CRITERIA)})  # the CLI names its flags from this
    return given


def _candidates(session: Session, c: dict, now: dt.datetime) -> List[Version]:
    """Committed versions matching every given criterion except max_total_bytes, least recently used first."""
    q = (select(Version).join(Entry, Entry.id == Version.entry_id).where(Version.state == "committed")
         .options(selectinload(Version.entry)))
    if "version_id" in c:
        q = q.where(Version.id == c["version_id"])
    if "entry_id" in c:
        q = q.where(Version.entry_id == c["entry_id"])
    if "name" in c:
        q = q.where(Entry.name == c["name"])
    if "torch_version" in c:
        q = q.where(Entry.torch == c["torch_version"])
    if "device" in c:
        q = q.where(Entry.device == c["device"])
    if "older_than" in c:
        q = q.where(Version.created_at < now - dt.timedelta(days=c["older_than"]))
    if "not_restored_for" in c:
        q = q.where(func.coalesce(Version.last_restored_at, Version.created_at)
                    < now - dt.timedelta(days=c["not_restored_for"]))
    versions = list(session.scalars(q))
    if "keep_latest" in c:
        newest = defaultdict(list)  # per key and kind: a new Mega-Cache blob must not push out the snapshot
        for entry_id, kind, vid in session.execute(select(Version.entry_id, Version.kind, Version.id)
                                                   .where(Version.state == "committed")
                                                   .order_by(*index.NEWEST_FIRST)):
            newest[(entry_id, kind)].append(vid)  # newest (last committed) first
        keep = {vid for ids in newest.values() for vid in ids[:c["keep_latest"]]}
        versions = [v for v in versions if v.id not in keep]
    versions.sort(key=lambda v: (v.last_restored_at or v.created_at, v.id))
    return versions


def _references(session: Session, states: tuple) -> Dict[int, set]:
    """version id -> set of blob digests, for versions in ``states``."""
    refs: Dict[int, set] = defaultdict(set)
    rows = session.execute(select(VersionFile.version_id, VersionFile.digest)
                           .join(Version, Version.id == VersionFile.version_id).where(Version.state.in_(states)))
    for vid, digest in rows:
        refs[vid].add(digest)
    return refs


def purge(session: Session, criteria: dict, dry_run: bool = False, now: Optional[dt.datetime] = None) -> dict:
    """Purge the committed versions matching every criterion (see ``CRITERIA``); return what went.

    ``max_total_bytes`` then keeps, of those, all but the least recently restored ones needed
    for the stored bytes of the remaining committed versions to fit. ``bytes_freed`` counts the
    stored bytes of blobs no remaining version names; GC deletes them once the grace has passed.
    Raises InvalidRequest when no criterion is given.
    """
    c = check_criteria(criteria)
    store_lock(session, exclusive=True)
    now = now or utcnow()  # after the lock: purged_at starts the grace when the purge really happens
    chosen = _candidates(session, c, now)
    refs = _references(session, ("committed", "pending"))
    sizes = dict(session.execute(select(Blob.digest, Blob.stored_size)).all())
    count = Counter(d for ds in refs.values() for d in ds)
    if "max_total_bytes" in c:
        committed = {vid for vid, in session.execute(select(Version.id).where(Version.state == "committed"))}
        live = Counter(d for vid in committed for d in refs.get(vid, ()))
        total = sum(sizes.get(d, 0) for d in live)
        picked = []
        for v in chosen:
            if total <= c["max_total_bytes"]:
                break
            picked.append(v)
            for d in refs.get(v.id, ()):
                live[d] -= 1
                if live[d] == 0:
                    total -= sizes.get(d, 0)
        chosen = picked
    freed = 0
    for v in chosen:
        for d in refs.get(v.id, ()):
            count[d] -= 1
            if count[d] == 0:
                freed += sizes.get(d, 0)
    entries: Dict[int, dict] = {}
    for v in chosen:
        e = v.entry
        row = entries.setdefault(e.id, {"id": e.id, "name": e.name, "shape": e.shape, "env": e.env(),
                                        "versions": [], "bytes": 0})
        row["versions"].append(v.id)
        row["bytes"] += v.total_bytes
    if not dry_run and chosen:
        session.execute(update(Version).where(Version.id.in_([v.id for v in chosen]))
                        .values(state="purged", purged_at=now))
    return {
        "dry_run": dry_run,
        "criteria": c,
        "entries": sorted(entries.values(), key=lambda r: (r["name"], r["id"])),
        "versions": [{"id": v.id, "entry_id": v.entry_id, "name": v.entry.name, "total_bytes": v.total_bytes,
                      "created_at": index.iso(v.created_at), "last_restored_at": index.iso(v.last_restored_at)}
                     for v in chosen],
        "version_count": len(chosen),
        "bytes_freed": freed,
    }


# -- garbage collection ----------------------------------------------------------------

def _drop_dead_versions(db: Database, settings: Settings, now: dt.datetime) -> dict:
    """Delete the rows of versions that protect nothing any more, and entries left empty."""
    grace = dt.timedelta(seconds=settings.GC_GRACE_SECONDS)
    with _gc_lock(db), db.session() as s:
        _sqlite_write_lock(s)
        dead = [vid for vid, in s.execute(select(Version.id).where(or_(
            (Version.state == "pending") & (Version.lease_expires_at < now - LEASE_MARGIN),
            (Version.state == "purged") & (Version.purged_at < now - grace))))]
        for i in range(0, len(dead), _BATCH):
            chunk = dead[i:i + _BATCH]
            s.execute(delete(VersionFile).where(VersionFile.version_id.in_(chunk)))
            s.execute(delete(PendingPack).where(PendingPack.version_id.in_(chunk)))
            s.execute(delete(Version).where(Version.id.in_(chunk)))
        empty = s.execute(delete(Entry).where(~exists().where(Version.entry_id == Entry.id),
                                              Entry.created_at < now - LEASE_MARGIN)).rowcount
    return {"versions_deleted": len(dead), "entries_deleted": empty}


def _unreferenced(digest_col):
    return ~exists().where(VersionFile.digest == digest_col) & ~exists().where(RemoteCacheItem.digest == digest_col)


def _evict_items(db: Database, settings: Settings, now: dt.datetime) -> dict:
    """Delete the remote-cache items not used for ``REMOTE_CACHE_MAX_IDLE_DAYS`` (0: never), so their
    blobs can be collected."""
    days = settings.REMOTE_CACHE_MAX_IDLE_DAYS
    if not days:
        return {"remote_cache_items_evicted": 0}
    with db.session() as s:
        gone = s.execute(delete(RemoteCacheItem).where(
            RemoteCacheItem.last_used_at < now - dt.timedelta(days=days))).rowcount
    return {"remote_cache_items_evicted": gone}


def _collect(db: Database, storage: Storage, pick: Callable, drop: Callable,
             delete_objects: Callable) -> Tuple[int, int, int]:
    """Delete unreferenced rows and their objects in batches, in digest order.

    ``pick(session, after)`` selects the next batch (rows with ``digest`` and ``stored_size``, digests
    above ``after``); ``drop(session, rows)`` deletes their rows and returns their objects, which
    ``delete_objects(storage, objects)`` (``content.delete_blobs``, ``delete_packs``) deletes. The
    objects go while SQLite's write lock is held, or on PostgreSQL right after the commit under the GC
    lock, which keeps publishes out, so nothing can name them again in between.
    Returns (rows deleted, stored bytes freed, object deletes that failed).
    """
    deleted = freed = failed = 0
    last = ""
    sqlite = db.engine.dialect.name != "postgresql"
    while True:
        with _gc_lock(db):
            with db.session() as s:
                _sqlite_write_lock(s)
                rows = pick(s, last)
                if not rows:
                    break
                last = rows[-1].digest
                objects = drop(s, rows)
                batch_bytes = sum(r.stored_size for r in rows)
                s.add(Event(kind="freed", bytes=batch_bytes))
                if sqlite:
                    failed += delete_objects(storage, objects)
            if not sqlite:
                failed += delete_objects(storage, objects)
        deleted += len(rows)
        freed += batch_bytes
    return deleted, freed, failed


def _collect_rows(db: Database, storage: Storage) -> dict:
    """Loose blobs no version or remote-cache item names: rows and objects."""
    def pick(s: Session, after: str) -> list:
        return s.execute(select(Blob.digest, Blob.encoding, Blob.stored_size)
                         .where(Blob.digest > after, Blob.pack_digest.is_(None), _unreferenced(Blob.digest))
                         .order_by(Blob.digest).limit(_BATCH)).all()

    def drop(s: Session, rows: list) -> List[Tuple[str, str]]:
        s.execute(delete(Blob).where(Blob.digest.in_([r.digest for r in rows])))
        return [(r.digest, r.encoding) for r in rows]

    deleted, freed, failed = _collect(db, storage, pick, drop, content.delete_blobs)
    return {"blobs_deleted": deleted, "bytes_freed": freed, "delete_failures": failed}


def _collect_packs(db: Database, storage: Storage) -> dict:
    """Packs none of whose members a version or remote-cache item names: objects, pack rows, member rows."""
    member = Blob.__table__.alias("member")
    live = exists().where(member.c.pack_digest == Pack.digest, ~_unreferenced(member.c.digest))

    def pick(s: Session, after: str) -> list:
        return s.execute(select(Pack.digest, Pack.stored_size).where(Pack.digest > after, ~live)
                         .order_by(Pack.digest).limit(_BATCH)).all()

    def drop(s: Session, rows: list) -> List[str]:
        chunk = [r.digest for r in rows]
        s.execute(delete(Blob).where(Blob.pack_digest.in_(chunk)))
        s.execute(delete(Pack).where(Pack.digest.in_(chunk)))
        return chunk

    deleted, freed, failed = _collect(db, storage, pick, drop, content.delete_packs)
    return {"packs_deleted": deleted, "pack_bytes_freed": freed, "pack_delete_failures": failed}


def _sweep_orphan_packs(db: Database, storage: Storage) -> int:
    """Pack objects with no row that no pending version is uploading (``pending_packs``): failed deletes,
    and the uploads of publishes that never committed (their rows go with the version, when
    ``_drop_dead_versions`` finds its lease run out)."""
    found = list(content.stored_packs(storage))
    removed = 0
    for i in range(0, len(found), _BATCH):
        chunk = found[i:i + _BATCH]
        with _gc_lock(db), db.session() as s:
            _sqlite_write_lock(s)
            kept = set(s.scalars(select(Pack.digest).where(Pack.digest.in_(chunk))))
            kept.update(s.scalars(select(PendingPack.digest).where(PendingPack.digest.in_(chunk))))
            doomed = [d for d in chunk if d not in kept]
            removed += len(doomed) - content.delete_packs(storage, doomed)
    return removed


def _sweep_orphans(db: Database, storage: Storage) -> dict:
    """Objects in storage with no blob row and no version naming them (failed deletes, abandoned uploads)."""
    found = list(content.stored_blobs(storage))
    removed = 0
    for i in range(0, len(found), _BATCH):
        chunk = found[i:i + _BATCH]
        digests = sorted({d for d, _ in chunk})
        with _gc_lock(db), db.session() as s:
            _sqlite_write_lock(s)
            rows = set(s.scalars(select(Blob.digest).where(Blob.digest.in_(digests))))
            named = set(s.scalars(select(VersionFile.digest).where(VersionFile.digest.in_(digests))))
            doomed = [(d, enc) for d, enc in chunk if d not in rows and d not in named]
            removed += len(doomed) - content.delete_blobs(storage, doomed)
    return {"orphans_deleted": removed, "orphan_packs_deleted": _sweep_orphan_packs(db, storage)}


def gc(db: Database, storage: Storage, settings: Settings, now: Optional[dt.datetime] = None) -> dict:
    """Collect garbage: dead version rows, empty entries, idle remote-cache items, unreferenced blobs, orphans.

    Returns counts and ``bytes_freed`` (stored bytes of the blob rows deleted). Safe to run
    while publishes, restores, purges and other GCs run (see the module docstring).
    """
    now = now or utcnow()
    result = _drop_dead_versions(db, settings, now)
    result.update(_evict_items(db, settings, now))
    result.update(_collect_rows(db, storage))
    packs = _collect_packs(db, storage)
    result["bytes_freed"] += packs.pop("pack_bytes_freed")
    result["delete_failures"] += packs.pop("pack_delete_failures")
    result.update(packs)
    result.update(_sweep_orphans(db, storage))
    lease = settings.UPLOAD_LEASE_SECONDS + LEASE_MARGIN.total_seconds()
    result["incoming_deleted"] = (content.sweep_received(storage, lease - (now - utcnow()).total_seconds())
                                  + _sweep_uploads(db, storage, now))
    return result


def _sweep_uploads(db: Database, storage: Storage, now: dt.datetime) -> int:
    """Delete the presigned uploads no commit will take (``v1/incoming/<version id>/``), whatever their age: every
    one but a pending version's within its lease (and LEASE_MARGIN). Those of a publish that never committed
    (its row dropped above), and PUTs of a URL replayed after its version committed (it stays valid for
    PRESIGN_EXPIRES). Listed before the versions are read: an upload exists only once its version does."""
    found = content.uploads_by_version(storage)
    removed, ids = 0, sorted(found)
    for i in range(0, len(ids), _BATCH):
        chunk = ids[i:i + _BATCH]
        with _gc_lock(db), db.session() as s:
            _sqlite_write_lock(s)
            live = set(s.scalars(select(Version.id).where(Version.id.in_(chunk), Version.state == "pending",
                                                          Version.lease_expires_at >= now - LEASE_MARGIN)))
            doomed = [k for v in chunk if v not in live for k in found[v]]
            removed += len(doomed) - content.delete_uploads(storage, doomed)
    return removed
