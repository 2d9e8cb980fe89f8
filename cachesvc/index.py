"""Queries on the index shared by publish, resolve and browse."""
from __future__ import annotations

import datetime as dt
import json
from typing import Dict, Iterable, List, Optional, Tuple

from sqlalchemy import and_, any_, bindparam, func, insert, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, aliased

from cachesvc_client.shared import keys, signing

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


#: rows per statement of a bulk insert (PostgreSQL sends each column as one array)
BULK_ROWS = 10_000


def _pg_bulk_insert(session: Session, model, rows: List[dict], *, ignore_conflicts: bool = False,
                    returning: Optional[str] = None) -> list:
    """INSERT ... SELECT FROM unnest(one array per column) on PostgreSQL: a statement per BULK_ROWS rows
    with one parameter per column, where an executemany or a multi-row VALUES sends (and psycopg parses)
    one parameter per cell. Returns the ``returning`` column of the inserted rows."""
    table = model.__table__
    names = list(rows[0])
    dialect = session.get_bind().dialect
    arrays = ", ".join(f"CAST(:{n} AS {table.c[n].type.compile(dialect)}[])" for n in names)
    sql = (f"INSERT INTO {table.name} ({', '.join(names)}) SELECT * FROM unnest({arrays})"
           + (" ON CONFLICT DO NOTHING" if ignore_conflicts else "")
           + (f" RETURNING {returning}" if returning else ""))
    out = []
    for i in range(0, len(rows), BULK_ROWS):
        chunk = rows[i:i + BULK_ROWS]
        result = session.execute(text(sql), {n: [r[n] for r in chunk] for n in names})
        if returning:
            out += result.scalars().all()
    return out


def insert_blobs(session: Session, rows: List[dict]) -> int:
    """Record stored blobs (ignoring ones already known) and a ``stored`` event with the new bytes.
    All ``rows`` carry the same keys (loose rows and packed rows go in separate calls)."""
    if not rows:
        return 0
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        added = _pg_bulk_insert(session, Blob, rows, ignore_conflicts=True, returning="stored_size")
    else:
        added = session.execute(sqlite.insert(Blob).on_conflict_do_nothing().returning(Blob.stored_size),
                                rows).scalars().all()
    if added:
        session.add(Event(kind="stored", bytes=sum(added)))
    return sum(added)


def insert_version_files(session: Session, version_id: int, files: List[dict]) -> None:
    """The manifest rows of a version (``files`` as the publish schema loads them)."""
    if not files:
        return
    rows = [{"version_id": version_id, "root": f["root"], "path": f["path"], "digest": f["sha256"],
             "size": f["size"], "mode": f["mode"] & 0o777} for f in files]
    if session.get_bind().dialect.name == "postgresql":
        _pg_bulk_insert(session, VersionFile, rows)
    else:
        session.execute(insert(VersionFile), rows)


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


#: "Newest" is the version committed last (``Version.commit_seq``), whatever the order of the ids
NEWEST_FIRST = (Version.commit_seq.desc(), Version.id.desc())


def lock_entry(session: Session, entry_id: int) -> Entry:
    """The entry, locked for the rest of the transaction, so that commits of one key happen one at a time:
    a row lock (``SELECT ... FOR UPDATE``) on PostgreSQL; on SQLite the publish already holds the database's
    write lock (``collect.store_lock``), which serialises every writer."""
    return session.scalars(select(Entry).where(Entry.id == entry_id).with_for_update()).one()


def next_commit_seq(session: Session) -> int:
    """The commit number of a version being committed now: one more than any so far. Call it holding the
    key's lock (``lock_entry``): then the numbers of one key strictly increase in the order of commits."""
    return int(session.scalar(select(func.coalesce(func.max(Version.commit_seq), 0)))) + 1


def newest_committed(session: Session, entry_id: int, kind: str = keys.DEFAULT_KIND) -> Optional[Version]:
    """The entry's newest (last committed) committed version of ``kind``."""
    return session.scalars(
        select(Version).where(Version.entry_id == entry_id, Version.kind == kind, Version.state == "committed")
        .order_by(*NEWEST_FIRST).limit(1)
    ).first()


def newest_version_id(entry_id) -> "select":
    """A scalar subquery: the id of the newest committed version (any kind) of the entry ``entry_id``
    (a column to correlate with)."""
    inner = aliased(Version)
    return (select(inner.id).where(inner.entry_id == entry_id, inner.state == "committed")
            .order_by(inner.commit_seq.desc(), inner.id.desc()).limit(1).correlate_except(inner).scalar_subquery())


def find_with_newest(session: Session, name: str, shape: str, tags: Dict[str, str], env: Dict[str, str],
                     kind: str = keys.DEFAULT_KIND) -> Tuple[Optional[Entry], Optional[Version]]:
    """The entry with this key and its newest committed version of ``kind`` (None, None / entry, None),
    in one query."""
    committed = and_(Version.entry_id == Entry.id, Version.kind == kind, Version.state == "committed")
    row = session.execute(
        select(Entry, Version).outerjoin(Version, committed)
        .where(Entry.key_digest == keys.key_digest(name, shape, tags, env))
        .order_by(*NEWEST_FIRST).limit(1)
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


def present_sizes(session: Session, digests: Iterable[str]) -> Dict[str, int]:
    """digest -> size of the blobs among ``digests`` that the index knows to be stored: ``present_blobs``
    for a whole manifest (up to CACHESVC_MAX_FILES), as plain rows, and on PostgreSQL one array
    parameter per 10,000 digests (``= ANY``) rather than a bound parameter each."""
    digests = list(digests)
    if session.get_bind().dialect.name != "postgresql":
        return {d: b.size for d, b in present_blobs(session, digests).items()}
    found: Dict[str, int] = {}
    for i in range(0, len(digests), BULK_ROWS):
        chunk = bindparam("digests", digests[i:i + BULK_ROWS], type_=postgresql.ARRAY(Blob.digest.type))
        found.update(session.execute(select(Blob.digest, Blob.size).where(Blob.digest == any_(chunk))).all())
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


def file_row(f) -> dict:
    """A file of a version as answers list it (``f``: a VersionFile, or a row with its columns)."""
    return {"root": f.root, "path": f.path, "sha256": f.digest, "size": f.size, "mode": f.mode}


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
        "problem": v.problem,
        **signature_fields(v),
    }


def signature_columns(record: Optional[dict]) -> dict:
    """The Version columns of a publish's signature record (``{}``: unsigned)."""
    return {"signer_key": record["public_key"], "signature": record["signature"]} if record else {}


def same_content(newest: Optional[Version], digest: str, columns: dict) -> bool:
    """``newest`` holds this content and, for a signed publish, this very signature (a signed publish of
    content an unsigned or otherwise signed version holds is a new version: restores that require the
    signature must find it)."""
    if newest is None or newest.manifest_digest != digest:
        return False
    return not columns or (newest.signer_key, newest.signature) == (columns["signer_key"], columns["signature"])


def signature_fields(v: Version) -> dict:
    """``signature`` (the publisher's record, for clients to verify; null: unsigned) and ``signed_by``
    (its key's fingerprint and comment, for people) of a version."""
    record = {"public_key": v.signer_key, "signature": v.signature} if v.signer_key and v.signature else None
    return {"signature": record, "signed_by": signing.describe(record)}
