"""packs: small blobs stored back to back in one object

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29 14:00:00

A ``packs`` table, and nullable ``blobs.pack_digest`` / ``blobs.pack_offset``:
existing blobs keep NULL there (an object of their own), so no data moves.
"""
from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('packs',
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('stored_size', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('digest')
    )
    with op.batch_alter_table('blobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('pack_digest', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('pack_offset', sa.BigInteger(), nullable=True))
        batch_op.create_index('ix_blobs_pack_digest', ['pack_digest'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('blobs', schema=None) as batch_op:
        batch_op.drop_index('ix_blobs_pack_digest')
        batch_op.drop_column('pack_offset')
        batch_op.drop_column('pack_digest')
    op.drop_table('packs')
