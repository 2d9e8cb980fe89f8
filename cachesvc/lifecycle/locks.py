"""The store lock: publishes take it shared, purge and each GC batch exclusively, so GC never deletes what a
publish in flight is about to name (``cachesvc.lifecycle.collect`` draws the whole story). On PostgreSQL an
advisory lock; on SQLite the database's write lock.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..db import Database

_LOCK_KEY = 0x63616368  # "cach": the advisory-lock key of the store lock


def store_lock(session: Session, exclusive: bool = False) -> None:
    """Take the store lock for the rest of ``session``'s transaction (shared: publishes; exclusive: purge)."""
    if session.get_bind().dialect.name == "postgresql":
        fn = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
        session.execute(text(f"SELECT {fn}(:k)"), {"k": _LOCK_KEY})
    else:  # SQLite: a write statement takes the database's write lock until commit
        session.execute(text("UPDATE blobs SET digest = digest WHERE 1 = 0"))


def sqlite_write_lock(session: Session) -> None:
    """Inside ``gc_lock``: on SQLite the batch's own write lock is the store lock (PostgreSQL holds it already)."""
    if session.get_bind().dialect.name != "postgresql":
        store_lock(session, exclusive=True)


@contextlib.contextmanager
def gc_lock(db: Database) -> Iterator[None]:
    """Exclusive store lock for one GC batch, held across commits (PostgreSQL) or by the batch's session (SQLite)."""
    if db.engine.dialect.name != "postgresql":
        yield
        return
    with db.engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _LOCK_KEY})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _LOCK_KEY})
            conn.commit()
