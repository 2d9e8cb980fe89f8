"""event_rollups: running totals of events per day and kind, for stats that cost the same at any age

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 07:10:00

The stats and /metrics summed the whole events table (0.5-3.9 s a scrape at a million rows); they
now read these rows (cachesvc.rollups keeps them as events are written). Filled here from the events
and the gc audit records already there, so every number is what it was.
"""
from alembic import op
import sqlalchemy as sa


revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "event_rollups",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("day", "kind"),
    )
    day = "CAST(at AS DATE)" if op.get_bind().dialect.name == "postgresql" else "date(at)"
    op.execute(
        f"INSERT INTO event_rollups (day, kind, count, bytes, seconds) "
        f"SELECT {day}, CASE WHEN kind = 'miss' AND version_id IS NOT NULL THEN 'fallback_restore' ELSE kind END, "
        f"COUNT(*), COALESCE(SUM(bytes), 0), COALESCE(SUM(seconds), 0) FROM events GROUP BY 1, 2")
    op.execute(f"INSERT INTO event_rollups (day, kind, count, bytes, seconds) "
               f"SELECT {day}, 'gc_run', COUNT(*), 0, 0 FROM audit_log WHERE action = 'gc' GROUP BY 1")


def downgrade() -> None:
    op.drop_table("event_rollups")
