"""blobs.stored_sha256: the sha256 of a blob's stored bytes, once the service has checked them

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29 14:30:00

Set by the service when it has decoded the stored bytes itself (upload through
the service, or read back at commit); NULL for rows from before and for blobs it
did not read.
"""
from alembic import op
import sqlalchemy as sa


revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("blobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stored_sha256", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("blobs", schema=None) as batch_op:
        batch_op.drop_column("stored_sha256")
