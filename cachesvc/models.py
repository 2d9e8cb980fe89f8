"""The index: entries (keys), their versions, the files of each version, blobs.

    Entry 1--* Version 1--* VersionFile *--1 Blob (by sha256, no FK: a pending
    version names blobs that are not uploaded yet)

A version is ``pending`` from publish until commit and ``committed`` after;
only committed versions are ever resolved, so a publish is visible whole or
not at all. ``Event`` rows feed the stats (publishes, hits, misses).
The schema itself is made by the Alembic migrations in ``migrations/``;
``tests/service/test_migrations.py`` checks the two agree.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Dict, List, Optional

from sqlalchemy import BigInteger, DateTime, Float, ForeignKey, Index, Integer, JSON, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


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
    __table_args__ = (Index("ix_versions_entry_state", "entry_id", "state", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    entry_id: Mapped[int] = mapped_column(ForeignKey("entries.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32), default="inductor-dir")
    state: Mapped[str] = mapped_column(String(16), default="pending")  # pending | committed
    manifest_digest: Mapped[str] = mapped_column(String(64))
    file_count: Mapped[int] = mapped_column(Integer)
    total_bytes: Mapped[int] = mapped_column(BigInteger)
    roots: Mapped[Dict[str, Any]] = mapped_column(JSON)  # role -> absolute path where published
    meta: Mapped[Dict[str, Any]] = mapped_column(JSON, default=dict)  # publisher host, client version
    compile_seconds: Mapped[Optional[float]] = mapped_column(Float)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    committed_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime)
    lease_expires_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime)
    last_restored_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime)
    restore_count: Mapped[int] = mapped_column(Integer, default=0)

    entry: Mapped[Entry] = relationship(back_populates="versions")
    files: Mapped[List["VersionFile"]] = relationship(cascade="all, delete-orphan", passive_deletes=True,
                                                      order_by="(VersionFile.root, VersionFile.path)")


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
    """A stored object: present in storage and verified (local) or stat'ed (S3)."""

    __tablename__ = "blobs"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)          # uncompressed bytes
    stored_size: Mapped[int] = mapped_column(BigInteger)   # bytes in storage
    encoding: Mapped[str] = mapped_column(String(16))      # identity | zstd
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_at", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    kind: Mapped[str] = mapped_column(String(16))  # publish | hit | miss
    entry_id: Mapped[Optional[int]] = mapped_column(Integer)
    version_id: Mapped[Optional[int]] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
