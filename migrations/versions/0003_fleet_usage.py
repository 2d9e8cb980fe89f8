"""fleet usage: what restoring processes report back (client.verify())

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 11:20:00

Per version: how many processes verified a restore of it, how many of those
got files but no cache hit, and the last verdict, so the pages can show
entries whose restores do not pay off. An index on the manifest digest
finds content already stored under another key (admission). New event kinds (``fallback``,
``linked``, ``verify``) need no schema change.
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('versions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('verify_count', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('no_hit_count', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('last_verdict', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('last_verified_at', sa.DateTime(), nullable=True))
        batch_op.create_index('ix_versions_manifest_digest', ['manifest_digest'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('versions', schema=None) as batch_op:
        batch_op.drop_index('ix_versions_manifest_digest')
        batch_op.drop_column('last_verified_at')
        batch_op.drop_column('last_verdict')
        batch_op.drop_column('no_hit_count')
        batch_op.drop_column('verify_count')
