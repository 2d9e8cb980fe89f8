"""Fallbacks: what a resolve offers when the exact key has no committed version.

Like CI caches' restore keys, the caller lists steps, tried in order; the
first that finds something answers:

``shape``
    the same name, tags and environment with any shape: the newest version.
``shapes``
    the same name, tags and environment with any shape: the newest version of
    each of the most restored shapes, as many as fit in ``max_bytes`` (their
    files are listed in that order; the client keeps the first of two files
    at one path).
``name``
    the same environment with any name (same tags first): the newest version.

No step crosses an environment field (``keys.ENV_FIELDS``: torch, Triton,
CUDA, Python, device, arch): Inductor keys its caches on all of them, so
such entries could never hit.

A fallback answer has the fields of a hit (``entry`` and ``version`` are the
first source) plus ``fallback``: ``{"step", "versions", "entries"}``, each
entry with the key fields it differs in. Every version used counts a restore
and a ``fallback`` event (stats), written in the request by ``hits.write_now``.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import List, Optional, Sequence

from sqlalchemy import and_, select
from sqlalchemy.orm import Session, contains_eager

from cachesvc_client.shared import keys

from . import explain, hits
from .. import index
from .answer import blob_entries
from ..models import Entry, Pack, Version, VersionFile
from ..storage.types import Storage
from ..config import Settings

STEPS = ("shape", "shapes", "name")


def candidates(session: Session, key: dict, step: str, max_bytes: int) -> List[Version]:
    """The versions step ``step`` would restore for ``key``, in priority order ([] when none).

    The newest committed version among a set of entries is the newest of its own entry, so
    ``shape`` and ``name`` need no per-entry grouping; ``shapes`` looks up each same-name
    entry's newest version (few entries, ``ix_versions_entry_state``).
    """
    same_env = and_(*(getattr(Entry, f) == key["env"][f] for f in keys.ENV_FIELDS))
    tags = keys.canonical_tags(key["tags"])
    committed = (select(Version).join(Entry, Entry.id == Version.entry_id).options(contains_eager(Version.entry))
                 .where(same_env, Version.state == "committed"))
    if step == "name":
        # the exact key has no committed version (or this is not a miss), so it is never among these;
        # the same tags first, as two walks down the version ids (an ORDER BY on the tag match would sort all)
        for q in (committed.where(Entry.tags == tags), committed):
            found = list(session.scalars(q.order_by(*index.NEWEST_FIRST).limit(1)))
            if found:
                return found
        return []
    same_name = (Entry.name == key["name"], Entry.tags == tags, Entry.shape != key["shape"])
    if step == "shape":
        return list(session.scalars(committed.where(*same_name).order_by(*index.NEWEST_FIRST).limit(1)))
    newest = index.newest_version_id(Entry.id)
    q = (select(Version).join(Entry, Entry.id == Version.entry_id).options(contains_eager(Version.entry))
         .where(same_env, *same_name, Version.id == newest)
         .order_by(Entry.restore_count.desc(), Version.id.desc()).limit(100))
    chosen, total = [], 0
    for v in session.scalars(q):
        if total + v.total_bytes > max_bytes:
            continue  # a smaller, less restored shape may still fit
        chosen.append(v)
        total += v.total_bytes
    return chosen


def resolve(session: Session, storage: Storage, settings: Settings, key: dict, steps: Sequence[str],
            max_bytes: Optional[int] = None) -> Optional[dict]:
    """The first step of ``steps`` that finds versions, as a resolve answer; None when none does."""
    max_bytes = settings.FALLBACK_MAX_BYTES if max_bytes is None else max_bytes
    for step in steps:
        versions = candidates(session, key, step, max_bytes)
        if versions:
            break
    else:
        return None
    ids = [v.id for v in versions]
    rank = {vid: i for i, vid in enumerate(ids)}
    files = sorted(session.execute(select(VersionFile).where(VersionFile.version_id.in_(ids))).scalars(),
                   key=lambda f: (rank[f.version_id], f.root, f.path))
    blobs = index.present_blobs(session, {f.digest for f in files})
    pack_sizes = dict(session.execute(select(Pack.digest, Pack.stored_size).where(
        Pack.digest.in_({b.pack_digest for b in blobs.values() if b.pack_digest}))).all())
    hits.write_now(session, [(v.entry_id, v.id, v.total_bytes, None) for v in versions], kind="fallback")
    expires = settings.PRESIGN_EXPIRES
    return {
        "hit": True,
        "entry": index.entry_summary(versions[0].entry),
        "version": index.version_summary(versions[0]),
        "files": [index.file_row(f) for f in files],
        "blobs": blob_entries(storage, [SimpleNamespace(digest=d, encoding=b.encoding, blob_size=b.size,
                                                        stored_size=b.stored_size, stored_sha256=b.stored_sha256,
                                                         pack_digest=b.pack_digest,
                                                        pack_offset=b.pack_offset, pack_size=pack_sizes.get(b.pack_digest))
                                       for d, b in blobs.items()],
                              expires),
        "fallback": {"step": step, "versions": ids,
                     "entries": [{"entry": index.entry_summary(v.entry), "version_id": v.id,
                                  "differs": explain.differences(v.entry, key)} for v in versions]},
    }
