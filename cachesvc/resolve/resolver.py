"""Resolve a key to its newest committed version of a kind, with where to fetch each blob."""
from __future__ import annotations

from typing import Optional, Sequence

from sqlalchemy.orm import Session

from . import explain, fallback
from .. import index
from .answer import blob_entries
from .hits import HitLog, write_now
from ..models import Event
from ..storage.types import Storage
from ..config import Settings


def resolve(session: Session, storage: Storage, settings: Settings, key: dict, fallbacks: Sequence[str] = (),
            fallback_max_bytes: Optional[int] = None, hits: Optional[HitLog] = None,
            kind: str = "inductor-dir", count: bool = True) -> dict:
    """Return the newest committed version of ``kind`` with its manifest and blob URLs, else the first
    fallback that finds something (``cachesvc.resolve.fallback``; inductor-dir only), else
    ``{"hit": False, "reason": ..., "nearest": [...]}`` (``cachesvc.resolve.explain``).

    A hit counts as a restore of the entry and the version (the counters the
    browse pages and purge-by-last-use read): recorded in ``hits``, which writes
    them within seconds, or in ``session`` at once when ``hits`` is None.
    A hit reads two queries and writes nothing in the request. ``count`` False: a look
    (``cachesvc-client check``), recorded as neither a restore nor a miss.
    """
    entry, version = index.find_with_newest(session, key["name"], key["shape"], key["tags"], key["env"], kind)
    if version is None:
        miss = Event(kind="miss", entry_id=entry.id if entry else None)
        if count:
            session.add(miss)
        reason = ("no entry has this key" if entry is None else "the entry has no committed version"
                  + ("" if kind == "inductor-dir" else f" of kind {kind}"))
        found = fallback.resolve(session, storage, settings, key, fallbacks, fallback_max_bytes) \
            if kind == "inductor-dir" else None
        if found is not None:
            miss.version_id = found["version"]["id"]  # the exact key missed, a fallback delivered (readmodel.stats)
            return dict(found, reason=reason)
        return {"hit": False, "reason": reason, "nearest": explain.nearest(session, key)}

    rows = index.files_with_blobs(session, version.id)
    expires = settings.PRESIGN_EXPIRES
    if not count:
        pass
    elif hits is None:
        write_now(session, [(entry.id, version.id, version.total_bytes, version.compile_seconds)])
    else:
        hits.record(entry.id, version.id, version.total_bytes, version.compile_seconds)
    return {
        "hit": True,
        "entry": index.entry_summary(entry),
        "version": index.version_summary(version),
        "files": [index.file_row(f) for f in rows],
        "blobs": blob_entries(storage, rows, expires),
    }

