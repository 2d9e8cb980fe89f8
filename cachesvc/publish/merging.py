"""Merge on publish: a key converges to the union of the shapes the fleet compiles.

Processes that restored a key's version and compiled more shapes each
publish what they have on disk. Without merging, the newest publish wins and
drops the shapes the others added (versions fork into partial ones). With
``merge`` (the client's default), the service adds to the manifest every
file of the key's newest committed version at a path the manifest lacks
(the publisher's own file wins at a path both have), so the new version is
a superset of the newest one; a publisher that added nothing then finds its
union equal to the newest version and creates nothing (``unchanged``).

Merged publishes of one key in flight at once all start from the same newest
version; the version's ``meta.merged_with`` records which (the service writes
it; a client's own ``merged_with`` is dropped). Commits of a key happen one at
a time (``index.lock_entry``), and each takes in the files of every version of
its key committed since its base (``catch_up``), the later committed winning at
a path both have, the publisher's own files winning over all. "Since" and
"newest" follow the commit order (``Version.commit_seq``), not the ids: a
publish created first may commit last, and then it is the newest, holding
everyone's files.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from cachesvc_client.shared import keys
from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import index
from ..errors import InvalidRequest
from ..models import Version, VersionFile

#: the meta field where a merged version records its base (the service's, never a client's)
BASE_FIELD = "merged_with"


def _missing_rows(session: Session, newest: Version, have: set) -> List[dict]:
    return [{"root": r, "path": p, "sha256": d, "size": s, "mode": m}
            for r, p, d, s, m in session.execute(
                select(VersionFile.root, VersionFile.path, VersionFile.digest, VersionFile.size, VersionFile.mode)
                .where(VersionFile.version_id == newest.id))
            if (r, p) not in have]


def _roots_for(rows: List[dict], roots: dict, newest: Version) -> dict:
    merged = dict(roots)
    for f in rows:
        merged.setdefault(f["root"], (newest.roots or {}).get(f["root"], f"/{f['root']}"))
    return merged


def without_base(meta: dict) -> dict:
    """A client's meta without ``merged_with``: only the service says what a version was merged with."""
    return {k: v for k, v in meta.items() if k != BASE_FIELD}


def union(session: Session, newest: Optional[Version], body: dict) -> Tuple[List[dict], dict]:
    """(files, body) of a merged publish: ``body``'s files plus the newest version's at other paths, its
    roots plus the newest version's roles, ``meta.merged_with`` the newest version's id ("0": none)."""
    files = body["files"]
    if newest is not None:
        added = _missing_rows(session, newest, {(f["root"], f["path"]) for f in files})
        files = files + added
        body = dict(body, roots=_roots_for(added, body["roots"], newest))
    meta = {**body["meta"], BASE_FIELD: str(newest.id if newest is not None else 0)}
    return files, dict(body, files=files, meta=meta)


def _base_of(session: Session, version: Version) -> Optional[int]:
    """The commit number after which ``version``'s merge must take versions in (0: every committed
    version of the key); None when it is not a merged version. Raises InvalidRequest for a
    ``merged_with`` that is not a version id."""
    base = (version.meta or {}).get(BASE_FIELD)
    if base is None:
        return None
    if not (isinstance(base, str) and base.isascii() and base.isdigit() and len(base) <= 10):
        raise InvalidRequest(f"meta.{BASE_FIELD} of version {version.id} is {str(base)[:40]!r}, not a version id; "
                             f"publish again (the service sets {BASE_FIELD} itself)", {"field": f"meta.{BASE_FIELD}"})
    seq = session.scalar(select(Version.commit_seq).where(Version.id == int(base))) if int(base) else 0
    return seq if seq is not None else 0  # base gone (collected): take in every committed version


def _committed_since(session: Session, version: Version, seq: int) -> List[Version]:
    """The key's committed versions of ``version``'s kind committed after number ``seq``, newest first."""
    return list(session.scalars(
        select(Version).where(Version.entry_id == version.entry_id, Version.kind == version.kind,
                              Version.state == "committed", Version.commit_seq > seq)
        .order_by(*index.NEWEST_FIRST)))


def catch_up(session: Session, version: Version) -> None:
    """At commit: a merged pending ``version`` takes in the files of every version of its key committed
    since its base. Call with the key's commits serialised (``commit_version`` holds the lock)."""
    seq = _base_of(session, version)
    if seq is None:
        return
    since = _committed_since(session, version, seq)
    if not since:
        return
    rows = [{"root": r, "path": p, "sha256": d, "size": s, "mode": m} for r, p, d, s, m in session.execute(
        select(VersionFile.root, VersionFile.path, VersionFile.digest, VersionFile.size, VersionFile.mode)
        .where(VersionFile.version_id == version.id))]
    have = {(r["root"], r["path"]) for r in rows}
    roots = version.roots or {}
    for other in since:  # newest first: at a path two of them have, the later commit wins
        added = _missing_rows(session, other, have)
        index.insert_version_files(session, version.id, added)
        have.update((r["root"], r["path"]) for r in added)
        rows += added
        roots = _roots_for(added, roots, other)
    version.roots = roots
    version.meta = {**(version.meta or {}), BASE_FIELD: str(since[0].id)}
    version.manifest_digest = keys.manifest_digest(rows)
    version.file_count = len(rows)
    version.total_bytes = sum(r["size"] for r in rows)
