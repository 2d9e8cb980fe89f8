"""Merge on publish: a key converges to the union of the shapes the fleet compiles.

Processes that restored a key's version and compiled more shapes each
publish what they have on disk. Without merging, the newest publish wins and
drops the shapes the others added (versions fork into partial ones). With
``merge`` (the client's default), the service adds to the manifest every
file of the key's newest committed version at a path the manifest lacks
(the publisher's own file wins at a path both have), so the new version is
a superset of the newest one; a publisher that added nothing then finds its
union equal to the newest version and creates nothing (``unchanged``).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from .models import Version, VersionFile


def union(session: Session, newest: Version, files: List[dict], roots: Dict[str, str]) -> Tuple[List[dict], Dict[str, str]]:
    """(``files`` plus the newest version's files at other paths, ``roots`` plus the newest version's roles)."""
    have = {(f["root"], f["path"]) for f in files}
    added = [{"root": f.root, "path": f.path, "sha256": f.digest, "size": f.size, "mode": f.mode}
             for f in session.scalars(select(VersionFile).where(VersionFile.version_id == newest.id))
             if (f.root, f.path) not in have]
    merged_roots = dict(roots)
    for f in added:
        merged_roots.setdefault(f["root"], (newest.roots or {}).get(f["root"], f"/{f['root']}"))
    return files + added, merged_roots
