"""pending_packs: the packs a pending version is uploading, so GC's orphan sweep leaves them alone

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29 17:30:00

Before this, GC swept pack objects with no ``packs`` row only while no version
was pending, which on a busy service is never. A pack upload that is in flight
while this migration runs has no row here: if GC sweeps it before the commit,
the commit answers with ``missing_packs`` and the client uploads it again.
"""
from alembic import op
import sqlalchemy as sa


revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pending_packs",
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["version_id"], ["versions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("version_id", "digest"),
    )
    op.create_index("ix_pending_packs_digest", "pending_packs", ["digest"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_pending_packs_digest", table_name="pending_packs")
    op.drop_table("pending_packs")
