"""versions.token_id: the token that created a version; only it gets its upload targets and commits it

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 07:20:00

Another write token could fetch the upload targets of a pending version it did not create (and
overwrite an upload in flight, which the creator's commit promoted) or commit it. Versions from
before this revision have none and keep the old rule.
"""
from alembic import op
import sqlalchemy as sa


revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("token_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("versions", schema=None) as batch_op:
        batch_op.drop_column("token_id")
