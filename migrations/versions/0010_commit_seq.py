"""versions.commit_seq: commit order, so "newest" is the version committed last, not the highest id

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 13:40:00

Ids follow the order versions were *created* in; a merged publish created
first but committed last (it took in the others' files) was hidden behind the
higher id of one committed before it. Existing committed and purged versions
get their id as their number, which keeps the order they resolved in; new
commits number on from the largest.
"""
from alembic import op
import sqlalchemy as sa


revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("commit_seq", sa.BigInteger(), nullable=True))
    op.execute("UPDATE versions SET commit_seq = id WHERE state <> 'pending'")
    op.create_index("ix_versions_entry_kind_seq", "versions", ["entry_id", "kind", "state", "commit_seq"],
                    unique=False)
    op.create_index("ix_versions_commit_seq", "versions", ["commit_seq"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_versions_commit_seq", table_name="versions")
    op.drop_index("ix_versions_entry_kind_seq", table_name="versions")
    with op.batch_alter_table("versions", schema=None) as batch_op:
        batch_op.drop_column("commit_seq")
