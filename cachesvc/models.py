"""The index: entries (keys), their versions, the files of each version, blobs.

    Entry 1--* Version 1--* VersionFile *--1 Blob (by sha256, no FK: a pending
    version names blobs that are not uploaded yet)

A version is ``pending`` from publish until commit and ``committed`` after;
only committed versions are ever resolved, so a publish is visible whole or
not at all. A purge moves committed versions to ``purged`` (soft delete: see
``cachesvc.lifecycle.collect`` for when their rows and blobs really go). ``Event`` rows
feed the stats (publishes, hits, misses, bytes stored and freed);
``AuditRecord`` rows say who changed what; ``Token`` rows hold the sha256 of
each bearer token, never the token. ``DemandFamily`` and ``DemandShape`` rows
are the fleet's shape demand: the calls each input shape of a key family made
(``cachesvc.demand``), apart from the entries (no foreign key to them).
The schema itself is made by the Alembic migrations in ``migrations/``;
``tests/service/test_migrations.py`` checks the two agree.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Dict, List, Optional

from sqlalchemy import BigInteger, Date, DateTime, Float, ForeignKey, Index, Integer, JSON, String, Text, UniqueConstraint, text
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


#: The largest value of an ``Integer`` id column (PostgreSQL's int4): lookups by a larger id find nothing
#: rather than reach the database, which refuses (PostgreSQL) or overflows (SQLite) on it.
MAX_ID = 2**31 - 1


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class Entry(Base):
    __tablename__ = "entries"
    __table_args__ = (
        UniqueConstraint("key_digest", name="uq_entries_key_digest"),
        Index("ix_entries_name", "name"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key_digest: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(200))
    shape: Mapped[str] = mapped_column(Text)
    tags: Mapped[str] = mapped_column(Text)  # canonical JSON, see keys.canonical_tags
    torch: Mapped[str] = mapped_column(String(200))
    triton: Mapped[str] = mapped_column(String(200))
    cuda: Mapped[str] = mapped_column(String(200))
    python: Mapped[str] = mapped_column(String(200))
    device: Mapped[str] = mapped_column(String(200))
    arch: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    last_restored_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime)
    restore_count: Mapped[int] = mapped_column(Integer, default=0)

    versions: Mapped[List["Version"]] = relationship(back_populates="entry", cascade="all, delete-orphan",
                                                      passive_deletes=True)

    def env(self) -> Dict[str, str]:
        return {"torch": self.torch, "triton": self.triton, "cuda": self.cuda,
                "python": self.python, "device": self.device, "arch": self.arch}


class Version(Base):
    __tablename__ = "versions"
    __table_args__ = (Index("ix_versions_entry_state", "entry_id", "state", "id"),
                      Index("ix_versions_manifest_digest", "manifest_digest"),  # admission: same content, other key
                      Index("ix_versions_entry_kind_state", "entry_id", "kind", "state", "id"),
                      Index("ix_versions_entry_kind_seq", "entry_id", "kind", "state", "commit_seq"),  # newest
                      Index("ix_versions_commit_seq", "commit_seq"))  # the next number, the newest of a name

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    entry_id: Mapped[int] = mapped_column(ForeignKey("entries.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32), default="inductor-dir")  # cachesvc_client.shared.keys.KINDS
    state: Mapped[str] = mapped_column(String(16), default="pending")  # pending | committed | purged
    manifest_digest: Mapped[str] = mapped_column(String(64))
    file_count: Mapped[int] = mapped_column(Integer)
    total_bytes: Mapped[int] = mapped_column(BigInteger)
    roots: Mapped[Dict[str, Any]] = mapped_column(JSON)  # role -> absolute path where published
    meta: Mapped[Dict[str, Any]] = mapped_column(JSON, default=dict)  # publisher host, client version
    compile_seconds: Mapped[Optional[float]] = mapped_column(Float)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    committed_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime)
    # Commit order: "newest" is the version committed last (cachesvc.index.NEWEST_FIRST), not the highest
    # id (ids follow create order; a publish created first may commit last). Set when the version becomes
    # committed, one more than any so far, under the key's commit lock (cachesvc.index.next_commit_seq), so
    # it strictly increases within a key; two keys committing at once may share a number. None while pending.
    commit_seq: Mapped[Optional[int]] = mapped_column(BigInteger)
    lease_expires_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime)
    # The token that created it: only that token gets its upload targets and commits it (None: created by a
    # `cachesvc` command on the database, or before this was recorded)
    token_id: Mapped[Optional[int]] = mapped_column(Integer)
    last_restored_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime)
    restore_count: Mapped[int] = mapped_column(Integer, default=0)
    purged_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime)
    # What processes that restored this version said afterwards (client.verify(), see cachesvc.resolve.verdicts)
    verify_count: Mapped[int] = mapped_column(Integer, default=0)
    no_hit_count: Mapped[int] = mapped_column(Integer, default=0)   # restores that delivered files but no hit
    last_verdict: Mapped[Optional[str]] = mapped_column(String(16))  # paid_off | partial | no_hits
    last_verified_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime)
    # An Ed25519 signature of the manifest and key by the publisher (cachesvc_client.shared.signing), checked for
    # shape only: the service trusts no key; clients with CACHESVC_TRUSTED_KEYS verify it. NULL: unsigned.
    signer_key: Mapped[Optional[str]] = mapped_column(String(1000))  # the OpenSSH public key line
    signature: Mapped[Optional[str]] = mapped_column(String(100))    # base64 of the 64-byte signature

    entry: Mapped[Entry] = relationship(back_populates="versions")
    files: Mapped[List["VersionFile"]] = relationship(cascade="all, delete-orphan", passive_deletes=True,
                                                      order_by="(VersionFile.root, VersionFile.path)")

    @hybrid_property
    def problem(self) -> bool:
        """Its restores deliver files but nothing hits: the last (trusted) verdict was ``no_hits``
        (``cachesvc.resolve.verdicts``). In a query too: ``select(Version).where(Version.problem)``."""
        return self.last_verdict == "no_hits"


class VersionFile(Base):
    __tablename__ = "version_files"
    __table_args__ = (Index("ix_version_files_digest", "digest"),)

    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id", ondelete="CASCADE"), primary_key=True)
    root: Mapped[str] = mapped_column(String(32), primary_key=True)
    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    mode: Mapped[int] = mapped_column(Integer)


class Blob(Base):
    """A stored object: present in storage and verified (local) or stat'ed (S3).

    A small blob may live in a pack instead of an object of its own: then ``pack_digest`` names
    the pack and its stored bytes are ``stored_size`` bytes at ``pack_offset`` (``cachesvc.content.packs``).
    """

    __tablename__ = "blobs"
    __table_args__ = (Index("ix_blobs_pack_digest", "pack_digest"),)

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)          # uncompressed bytes
    stored_size: Mapped[int] = mapped_column(BigInteger)   # bytes in storage
    encoding: Mapped[str] = mapped_column(String(16))      # identity | zstd
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    # sha256 of the stored bytes, set only once the service itself has decoded exactly those bytes to
    # ``digest`` (cachesvc.content.blobs); NULL: unchecked by the service, the client hashes the decoded bytes
    stored_sha256: Mapped[Optional[str]] = mapped_column(String(64))
    pack_digest: Mapped[Optional[str]] = mapped_column(String(64))  # None: an object of its own
    pack_offset: Mapped[Optional[int]] = mapped_column(BigInteger)


class Pack(Base):
    """An object holding the stored bytes of several small blobs, back to back; deleted whole by GC
    once no protecting version names any of its members."""

    __tablename__ = "packs"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the pack's bytes
    stored_size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class PendingPack(Base):
    """A pack a pending version was given an upload target for. It has no ``packs`` row until the
    version's commit verifies it, so this row is what keeps GC's orphan sweep off its object; the
    commit deletes it, and GC with the version when the upload lease runs out."""

    __tablename__ = "pending_packs"
    __table_args__ = (Index("ix_pending_packs_digest", "digest"),)

    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id", ondelete="CASCADE"), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_at", "at"),
                      Index("ix_events_entry_kind", "entry_id", "kind"))  # the pages' hit rates per entry

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    kind: Mapped[str] = mapped_column(String(16))  # publish | hit | fallback | miss | linked | stored | freed | verify
    entry_id: Mapped[Optional[int]] = mapped_column(Integer)
    version_id: Mapped[Optional[int]] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    seconds: Mapped[Optional[float]] = mapped_column(Float)  # hit: the version's cold compile seconds, saved


class EventRollup(Base):
    """Running totals of events per day and counted kind (``cachesvc.rollups``): what the stats and /metrics
    read, so a scrape costs the same at any age and the numbers outlive the events' retention."""

    __tablename__ = "event_rollups"

    day: Mapped[dt.date] = mapped_column(Date, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)  # Event.kind, fallback_restore, gc_run
    count: Mapped[int] = mapped_column(BigInteger, default=0)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    seconds: Mapped[float] = mapped_column(Float, default=0.0)


class Token(Base):
    """A bearer token: only its sha256 is kept. ``scope`` is read < write < admin."""

    __tablename__ = "tokens"
    __table_args__ = (UniqueConstraint("token_hash", name="uq_tokens_token_hash"),
                      # one active token per name, so `token revoke NAME` means one token; a revoked
                      # token's name may be given again (migration 0015_unique_token_names)
                      Index("uq_tokens_active_name", "name", unique=True,
                            sqlite_where=text("revoked_at IS NULL"), postgresql_where=text("revoked_at IS NULL")))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    scope: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    revoked_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime)


class PageSession(Base):
    """A sign-in on the pages: the cookie holds a random id, the table its sha256. Signing out deletes the
    row, so a copied cookie opens nothing after it (the cookie alone cannot be recalled)."""

    __tablename__ = "page_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[int] = mapped_column(ForeignKey("tokens.id"), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime, index=True)
    # what a POST leaves for the page it redirects to (a new token, shown once: auth.hold_for_page), as
    # JSON; here and not in the cookie, which is signed, not encrypted (migration 0016_page_session_flash)
    flash: Mapped[Optional[str]] = mapped_column(Text, nullable=True)


class AuditRecord(Base):
    """Who did what, when, and how many bytes it moved (publish, purge, gc, token changes)."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_at", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    actor: Mapped[str] = mapped_column(String(120))   # "token:<name>", "anonymous" or "cli:<user>"
    action: Mapped[str] = mapped_column(String(32))   # publish | purge | gc | token.create | token.revoke
    target: Mapped[str] = mapped_column(String(300), default="")
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    details: Mapped[Dict[str, Any]] = mapped_column(JSON, default=dict)


class RemoteCacheItem(Base):
    """One value of Inductor's live remote cache (see ``cachesvc.remote_cache``): bytes in the blob store.

    ``(cache, env_digest, key)`` names it: ``cache`` as the client names Inductor's cache (``fx-graph``,
    ``autotune``, ...), ``env_digest`` the sha256 of the process's environment fingerprint (``env``
    keeps the fields for display), ``key`` as Inductor gives it.
    """

    __tablename__ = "remote_cache_items"
    __table_args__ = (
        UniqueConstraint("cache", "env_digest", "key", name="uq_remote_cache_items_name"),
        Index("ix_remote_cache_items_digest", "digest"),
        Index("ix_remote_cache_items_last_used_at", "last_used_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cache: Mapped[str] = mapped_column(String(64))
    env_digest: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(512))
    env: Mapped[Dict[str, Any]] = mapped_column(JSON)
    digest: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    last_used_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    hit_count: Mapped[int] = mapped_column(Integer, default=0)


class DemandFamily(Base):
    """A key family (a key without its shape: name, tags, environment) whose calls processes report
    (``POST /api/v1/usage``, ``cachesvc.demand``). Made only for a name that has an entry, but not tied to
    one: purging or collecting entries leaves the demand (it is about the model, not a version)."""

    __tablename__ = "demand_families"
    __table_args__ = (UniqueConstraint("family_digest", name="uq_demand_families_family_digest"),
                      Index("ix_demand_families_name", "name"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    family_digest: Mapped[str] = mapped_column(String(64))  # keys.family_digest
    name: Mapped[str] = mapped_column(String(200))
    tags: Mapped[str] = mapped_column(Text)  # canonical JSON, see keys.canonical_tags
    torch: Mapped[str] = mapped_column(String(200))
    triton: Mapped[str] = mapped_column(String(200))
    cuda: Mapped[str] = mapped_column(String(200))
    python: Mapped[str] = mapped_column(String(200))
    device: Mapped[str] = mapped_column(String(200))
    arch: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)

    def env(self) -> Dict[str, str]:
        return {"torch": self.torch, "triton": self.triton, "cuda": self.cuda,
                "python": self.python, "device": self.device, "arch": self.arch}


class DemandShape(Base):
    """One input shape of a key family: its calls so far, by how each was served, added to by every report.

    Unique by the shape's sha256, not its text: a shape of 2,000 four-byte characters is longer than a
    PostgreSQL btree row may be."""

    __tablename__ = "demand_shapes"
    __table_args__ = (UniqueConstraint("family_id", "shape_digest", name="uq_demand_shapes_family_shape"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    family_id: Mapped[int] = mapped_column(ForeignKey("demand_families.id", ondelete="CASCADE"))
    shape_digest: Mapped[str] = mapped_column(String(64))  # sha256 of the shape's UTF-8
    shape: Mapped[str] = mapped_column(Text)
    package_calls: Mapped[int] = mapped_column(BigInteger, default=0)  # served by a package
    compile_calls: Mapped[int] = mapped_column(BigInteger, default=0)  # by torch.compile
    eager_calls: Mapped[int] = mapped_column(BigInteger, default=0)    # by the model itself
    first_seen: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    last_seen: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
