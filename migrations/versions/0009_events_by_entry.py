"""events by entry and kind: the pages' per-entry and per-version hit rates read verdict events of a page's entries

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 13:40:00

Without it every index page scanned the whole events table (one row per restore).
"""
from alembic import op


revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_events_entry_kind", "events", ["entry_id", "kind"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_events_entry_kind", table_name="events")
