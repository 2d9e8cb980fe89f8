"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-29 08:26:37.236067
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('blobs',
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('stored_size', sa.BigInteger(), nullable=False),
    sa.Column('encoding', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('digest')
    )
    op.create_table('entries',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key_digest', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('shape', sa.Text(), nullable=False),
    sa.Column('tags', sa.Text(), nullable=False),
    sa.Column('torch', sa.String(length=200), nullable=False),
    sa.Column('triton', sa.String(length=200), nullable=False),
    sa.Column('cuda', sa.String(length=200), nullable=False),
    sa.Column('python', sa.String(length=200), nullable=False),
    sa.Column('device', sa.String(length=200), nullable=False),
    sa.Column('arch', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('last_restored_at', sa.DateTime(), nullable=True),
    sa.Column('restore_count', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key_digest', name='uq_entries_key_digest')
    )
    with op.batch_alter_table('entries', schema=None) as batch_op:
        batch_op.create_index('ix_entries_name', ['name'], unique=False)

    op.create_table('events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('entry_id', sa.Integer(), nullable=True),
    sa.Column('version_id', sa.Integer(), nullable=True),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index('ix_events_at', ['at'], unique=False)

    op.create_table('versions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('entry_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('manifest_digest', sa.String(length=64), nullable=False),
    sa.Column('file_count', sa.Integer(), nullable=False),
    sa.Column('total_bytes', sa.BigInteger(), nullable=False),
    sa.Column('roots', sa.JSON(), nullable=False),
    sa.Column('meta', sa.JSON(), nullable=False),
    sa.Column('compile_seconds', sa.Float(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('committed_at', sa.DateTime(), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(), nullable=True),
    sa.Column('last_restored_at', sa.DateTime(), nullable=True),
    sa.Column('restore_count', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['entry_id'], ['entries.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('versions', schema=None) as batch_op:
        batch_op.create_index('ix_versions_entry_state', ['entry_id', 'state', 'id'], unique=False)

    op.create_table('version_files',
    sa.Column('version_id', sa.Integer(), nullable=False),
    sa.Column('root', sa.String(length=32), nullable=False),
    sa.Column('path', sa.String(length=1024), nullable=False),
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('mode', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['version_id'], ['versions.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('version_id', 'root', 'path')
    )
    with op.batch_alter_table('version_files', schema=None) as batch_op:
        batch_op.create_index('ix_version_files_digest', ['digest'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('version_files', schema=None) as batch_op:
        batch_op.drop_index('ix_version_files_digest')

    op.drop_table('version_files')
    with op.batch_alter_table('versions', schema=None) as batch_op:
        batch_op.drop_index('ix_versions_entry_state')

    op.drop_table('versions')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index('ix_events_at')

    op.drop_table('events')
    with op.batch_alter_table('entries', schema=None) as batch_op:
        batch_op.drop_index('ix_entries_name')

    op.drop_table('entries')
    op.drop_table('blobs')
