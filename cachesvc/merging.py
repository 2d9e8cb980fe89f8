"""Merge on publish: a key converges to the union of the shapes the fleet compiles.

Processes that restored a key's version and compiled more shapes each
publish what they have on disk. Without merging, the newest publish wins and
drops the shapes the others added (versions fork into partial ones). With
``merge`` (the client's default), the service adds to the manifest every
file of the key's newest committed version at a path the manifest lacks
(the publisher's own file wins at a path both have), so the new version is
a superset of the newest one; a publisher that added nothing then finds its
union equal to the newest version and creates nothing (``unchanged``).

Two merged publishes of one key in flight at once both start from the same
newest version; the version's ``meta.merged_with`` records which, and the
later commit (commits of a key are serialised) takes in the files of a
version committed since (``catch_up``), so neither's shapes are lost.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from cachesvc_client import keys
from sqlalchemy import select
from sqlalchemy.orm import Session

from . import index
from .models import Version, VersionFile


def _missing_rows(session: Session, newest: Version, have: set) -> List[dict]:
    return [{"root": f.root, "path": f.path, "sha256": f.digest, "size": f.size, "mode": f.mode}
            for f in session.scalars(select(VersionFile).where(VersionFile.version_id == newest.id))
            if (f.root, f.path) not in have]


def _roots_for(rows: List[dict], roots: dict, newest: Version) -> dict:
    merged = dict(roots)
    for f in rows:
        merged.setdefault(f["root"], (newest.roots or {}).get(f["root"], f"/{f['root']}"))
    return merged


def union(session: Session, newest: Optional[Version], body: dict) -> Tuple[List[dict], dict]:
    """(files, body) of a merged publish: ``body``'s files plus the newest version's at other paths, its
    roots plus the newest version's roles, ``meta.merged_with`` the newest version's id ("0": none)."""
    files = body["files"]
    if newest is not None:
        added = _missing_rows(session, newest, {(f["root"], f["path"]) for f in files})
        files = files + added
        body = dict(body, roots=_roots_for(added, body["roots"], newest))
    meta = {**body["meta"], "merged_with": str(newest.id if newest is not None else 0)}
    return files, dict(body, files=files, meta=meta)


def catch_up(session: Session, version: Version, newest: Optional[Version]) -> None:
    """At commit: a merged pending ``version`` takes in the files of a version of its key committed
    after it was created. Call with the key's commits serialised (``commit_version`` holds the lock)."""
    base = (version.meta or {}).get("merged_with")
    if base is None or newest is None or newest.id <= int(base):
        return
    mine = session.execute(select(VersionFile.root, VersionFile.path, VersionFile.digest, VersionFile.size,
                                  VersionFile.mode).where(VersionFile.version_id == version.id)).all()
    rows = [{"root": r, "path": p, "sha256": d, "size": s, "mode": m} for r, p, d, s, m in mine]
    added = _missing_rows(session, newest, {(r["root"], r["path"]) for r in rows})
    index.insert_version_files(session, version.id, added)
    rows += added
    version.roots = _roots_for(added, version.roots or {}, newest)
    version.meta = {**(version.meta or {}), "merged_with": str(newest.id)}
    version.manifest_digest = keys.manifest_digest(rows)
    version.file_count = len(rows)
    version.total_bytes = sum(r["size"] for r in rows)
