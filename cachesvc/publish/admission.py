"""Publish only what pays: content already stored under another key is linked, not uploaded.

The client skips a publish whose cold compile was short (``min_compile_seconds``);
the service adds the other half of the rule, as JAX's cache does: when a
publish's manifest digest equals a committed version of *another* key, the
new key gets a committed version naming the same files at once (status
``linked``, nothing to upload, a ``linked`` event). Same content means the
same (root, path, sha256, mode) rows, so the blobs are stored already; a
committed version protects them from GC and the caller holds the store lock.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import index
from ..models import Entry, Event, Version, utcnow


def link(session: Session, entry: Entry, body: dict, files: List[dict], digest: str,
         sizes: Dict[str, int]) -> Optional[Tuple[int, dict]]:
    """A committed version of ``entry`` with the files of an existing version of equal content; None when
    no committed version of another entry has ``digest`` (or one of its blobs is gone)."""
    same = session.scalars(select(Version).where(Version.manifest_digest == digest, Version.state == "committed",
                                                 Version.entry_id != entry.id)
                           .order_by(Version.id.desc()).limit(1)).first()
    if same is None or len(index.present_sizes(session, sizes)) < len(sizes):
        return None
    index.lock_entry(session, entry.id)  # a commit of the key, numbered as one (see commit_version)
    now = utcnow()
    version = Version(
        entry_id=entry.id, kind=body["kind"], state="committed", manifest_digest=digest, file_count=len(files),
        total_bytes=sum(f["size"] for f in files), roots=body["roots"],
        meta={**body["meta"], "linked_from": str(same.id)}, compile_seconds=body["compile_seconds"],
        created_at=now, committed_at=now, commit_seq=index.next_commit_seq(session), restore_count=0,
        **index.signature_columns(body.get("signature")),
    )
    session.add(version)
    session.flush()
    index.insert_version_files(session, version.id, files)
    session.add(Event(kind="linked", entry_id=entry.id, version_id=version.id, bytes=version.total_bytes))
    return 200, {"status": "linked", "entry": index.entry_summary(entry), "version": index.version_summary(version),
                 "upload": [], "linked_to": {"entry_id": same.entry_id, "version_id": same.id}}
