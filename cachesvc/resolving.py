"""Resolve a key to its newest committed version of a kind, with where to fetch each blob."""
from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from . import index
from .models import Entry, Event, Version, VersionFile, utcnow
from .storage import Storage, blob_key


def blob_url(storage: Storage, digest: str, encoding: str, expires: int) -> str:
    return storage.download_url(blob_key(digest, encoding), expires) or f"/api/v1/blobs/{digest}"


def resolve(session: Session, storage: Storage, settings: dict, key: dict, kind: str = "inductor-dir") -> dict:
    """Return ``{"hit": False, "reason": ...}`` or the version's manifest and blob URLs.

    A hit counts as a restore of the entry and the version (the counters the
    browse pages and purge-by-last-use read).
    """
    entry = index.find_entry(session, key["name"], key["shape"], key["tags"], key["env"])
    version = index.newest_committed(session, entry.id, kind) if entry else None
    if version is None:
        session.add(Event(kind="miss", entry_id=entry.id if entry else None))
        reason = ("no entry has this key" if entry is None else "the entry has no committed version"
                  + ("" if kind == "inductor-dir" else f" of kind {kind}"))
        return {"hit": False, "reason": reason}

    files = session.execute(select(VersionFile.root, VersionFile.path, VersionFile.digest, VersionFile.size,
                                   VersionFile.mode).where(VersionFile.version_id == version.id)
                            .order_by(VersionFile.root, VersionFile.path)).all()
    blobs = index.present_blobs(session, {f.digest for f in files})
    expires = settings["PRESIGN_EXPIRES"]
    now = utcnow()
    session.execute(update(Entry).where(Entry.id == entry.id)
                    .values(restore_count=Entry.restore_count + 1, last_restored_at=now))
    session.execute(update(Version).where(Version.id == version.id)
                    .values(restore_count=Version.restore_count + 1, last_restored_at=now))
    session.add(Event(kind="hit", entry_id=entry.id, version_id=version.id, bytes=version.total_bytes,
                      seconds=version.compile_seconds))
    return {
        "hit": True,
        "entry": index.entry_summary(entry),
        "version": index.version_summary(version),
        "files": [{"root": f.root, "path": f.path, "sha256": f.digest, "size": f.size, "mode": f.mode}
                  for f in files],
        "blobs": {d: {"url": blob_url(storage, d, b.encoding, expires), "encoding": b.encoding,
                      "size": b.size, "stored_size": b.stored_size} for d, b in blobs.items()},
    }
