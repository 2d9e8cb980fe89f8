"""artifact kinds: resolve finds the newest committed version of a kind

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 11:30:00

``versions.kind`` exists since 0001 (every row so far is ``inductor-dir``);
resolve now filters on it, so the index that serves "newest committed
version of this entry and kind" leads with (entry_id, kind, state).
"""
from alembic import op


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('versions', schema=None) as batch_op:
        batch_op.create_index('ix_versions_entry_kind_state', ['entry_id', 'kind', 'state', 'id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('versions', schema=None) as batch_op:
        batch_op.drop_index('ix_versions_entry_kind_state')
