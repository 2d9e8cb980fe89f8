"""Queries on the index shared by publish, resolve and browse."""
from __future__ import annotations

import datetime as dt
import json
from typing import Dict, Iterable, List, Optional, Set, Tuple

from sqlalchemy import and_, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from cachesvc_client import keys

from . import verdicts
from .errors import InvalidRequest, NotFound
from .models import MAX_ID, Blob, Entry, Event, Pack, Version, VersionFile


def iso(t: Optional[dt.datetime]) -> Optional[str]:
    return t.isoformat(timespec="seconds") + "Z" if t else None


def parse_tags(text: str) -> Dict[str, str]:
    try:
        return keys.check_tags(json.loads(text))
    except RecursionError:  # '[' * 1000: json.loads recurses once per level
        raise InvalidRequest("tags must be a JSON object of strings: it is nested too deeply") from None
    except (ValueError, keys.InvalidKey) as exc:
        raise InvalidRequest(f"tags must be a JSON object of strings: {exc}") from None


def insert_ignore(session: Session, model, rows: List[dict]) -> None:
    """INSERT ... ON CONFLICT DO NOTHING on PostgreSQL and SQLite."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    mod = postgresql if dialect == "postgresql" else sqlite
    session.execute(mod.insert(model).on_conflict_do_nothing(), rows)


def insert_blobs(session: Session, rows: List[dict]) -> int:
    """Record stored blobs (ignoring ones already known) and a ``stored`` event with the new bytes.
    All ``rows`` carry the same keys (loose rows and packed rows go in separate calls)."""
    if not rows:
        return 0
    dialect = session.get_bind().dialect.name
    mod = postgresql if dialect == "postgresql" else sqlite
    added = session.execute(mod.insert(Blob).on_conflict_do_nothing().returning(Blob.stored_size), rows).scalars().all()
    if added:
        session.add(Event(kind="stored", bytes=sum(added)))
    return sum(added)


def insert_version_files(session: Session, version_id: int, files: List[dict]) -> None:
    """The manifest rows of a version (``files`` as the publish schema loads them)."""
    if files:
        session.execute(insert(VersionFile), [
            {"version_id": version_id, "root": f["root"], "path": f["path"], "digest": f["sha256"],
             "size": f["size"], "mode": f["mode"] & 0o777} for f in files])


def get_or_404(session: Session, model, ident, what: str):
    obj = session.get(model, ident) if 0 <= ident <= MAX_ID else None
    if obj is None:
        raise NotFound(f"{what} {ident} does not exist")
    return obj


def find_entry(session: Session, name: str, shape: str, tags: Dict[str, str], env: Dict[str, str],
               create: bool = False) -> Optional[Entry]:
    digest = keys.key_digest(name, shape, tags, env)
    q = select(Entry).where(Entry.key_digest == digest)
    entry = session.scalars(q).first()
    if entry is None and create:
        insert_ignore(session, Entry, [dict(key_digest=digest, name=name, shape=shape,
                                            tags=keys.canonical_tags(tags), restore_count=0, **env)])
        entry = session.scalars(q).one()
    return entry


def newest_committed(session: Session, entry_id: int, kind: str = keys.DEFAULT_KIND) -> Optional[Version]:
    """The entry's newest committed version of ``kind``."""
    return session.scalars(
        select(Version).where(Version.entry_id == entry_id, Version.kind == kind, Version.state == "committed")
        .order_by(Version.id.desc()).limit(1)
    ).first()


def find_with_newest(session: Session, name: str, shape: str, tags: Dict[str, str], env: Dict[str, str],
                     kind: str = keys.DEFAULT_KIND) -> Tuple[Optional[Entry], Optional[Version]]:
    """The entry with this key and its newest committed version of ``kind`` (None, None / entry, None),
    in one query."""
    committed = and_(Version.entry_id == Entry.id, Version.kind == kind, Version.state == "committed")
    row = session.execute(
        select(Entry, Version).outerjoin(Version, committed)
        .where(Entry.key_digest == keys.key_digest(name, shape, tags, env))
        .order_by(Version.id.desc()).limit(1)
    ).first()
    return (row[0], row[1]) if row else (None, None)


def files_with_blobs(session: Session, version_id: int) -> list:
    """The version's files by (root, path), each with its blob's encoding and sizes (None when no blob row).

    Rows: ``root, path, digest, size, mode, encoding, blob_size, stored_size, stored_sha256, pack_digest,
    pack_offset, pack_size``; one query.
    """
    return session.execute(
        select(VersionFile.root, VersionFile.path, VersionFile.digest, VersionFile.size, VersionFile.mode,
               Blob.encoding, Blob.size.label("blob_size"), Blob.stored_size, Blob.stored_sha256, Blob.pack_digest,
               Blob.pack_offset,
               Pack.stored_size.label("pack_size"))
        .outerjoin(Blob, Blob.digest == VersionFile.digest)
        .outerjoin(Pack, Pack.digest == Blob.pack_digest)
        .where(VersionFile.version_id == version_id)
        .order_by(VersionFile.root, VersionFile.path)
    ).all()


def present_blobs(session: Session, digests: Iterable[str]) -> Dict[str, Blob]:
    """The blobs among ``digests`` that the index knows to be stored."""
    digests = list(digests)
    found: Dict[str, Blob] = {}
    for i in range(0, len(digests), 500):
        chunk = digests[i:i + 500]
        for blob in session.scalars(select(Blob).where(Blob.digest.in_(chunk))):
            found[blob.digest] = blob
    return found


def entry_summary(entry: Entry) -> dict:
    return {
        "id": entry.id,
        "name": entry.name,
        "shape": entry.shape,
        "tags": json.loads(entry.tags),
        "env": entry.env(),
        "created_at": iso(entry.created_at),
        "last_restored_at": iso(entry.last_restored_at),
        "restore_count": entry.restore_count,
    }


def version_summary(v: Version) -> dict:
    return {
        "id": v.id,
        "entry_id": v.entry_id,
        "kind": v.kind,
        "state": v.state,
        "manifest_digest": v.manifest_digest,
        "file_count": v.file_count,
        "total_bytes": v.total_bytes,
        "roots": v.roots,
        "compile_seconds": v.compile_seconds,
        "meta": v.meta or {},
        "created_at": iso(v.created_at),
        "committed_at": iso(v.committed_at),
        "last_restored_at": iso(v.last_restored_at),
        "restore_count": v.restore_count,
        "verify_count": v.verify_count,
        "no_hit_count": v.no_hit_count,
        "last_verdict": v.last_verdict,
        "problem": verdicts.is_problem(v),
    }


def unique_digests(files: Iterable[dict]) -> Set[str]:
    return {f["sha256"] for f in files}
