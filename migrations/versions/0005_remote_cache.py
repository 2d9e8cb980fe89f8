"""remote_cache_items: Inductor's live remote cache (FX graphs, autotune results)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29 11:20:00

The values are blobs in the existing store; this table names them by
(cache, environment digest, Inductor's key). ``down_revision`` is re-chained
after the other branches' 0003/0004 at merge.
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('remote_cache_items',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('cache', sa.String(length=64), nullable=False),
    sa.Column('env_digest', sa.String(length=64), nullable=False),
    sa.Column('key', sa.String(length=512), nullable=False),
    sa.Column('env', sa.JSON(), nullable=False),
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('last_used_at', sa.DateTime(), nullable=False),
    sa.Column('hit_count', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('cache', 'env_digest', 'key', name='uq_remote_cache_items_name')
    )
    with op.batch_alter_table('remote_cache_items', schema=None) as batch_op:
        batch_op.create_index('ix_remote_cache_items_digest', ['digest'], unique=False)
        batch_op.create_index('ix_remote_cache_items_last_used_at', ['last_used_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('remote_cache_items', schema=None) as batch_op:
        batch_op.drop_index('ix_remote_cache_items_last_used_at')
        batch_op.drop_index('ix_remote_cache_items_digest')
    op.drop_table('remote_cache_items')
