"""tokens, audit log, soft-deleted (purged) versions

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 09:10:00

Hit events get the compile seconds they saved (kept even after the version
is purged). Also records one ``stored`` event with the bytes already in the blob store,
so the stats page's stored-bytes curve starts from the right total on a
database that was in use before this revision.
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('tokens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('scope', sa.String(length=16), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('revoked_at', sa.DateTime(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('token_hash', name='uq_tokens_token_hash')
    )
    op.create_table('audit_log',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(), nullable=False),
    sa.Column('actor', sa.String(length=120), nullable=False),
    sa.Column('action', sa.String(length=32), nullable=False),
    sa.Column('target', sa.String(length=300), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.create_index('ix_audit_log_at', ['at'], unique=False)

    with op.batch_alter_table('versions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('purged_at', sa.DateTime(), nullable=True))

    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.add_column(sa.Column('seconds', sa.Float(), nullable=True))
    op.execute(
        "UPDATE events SET seconds = (SELECT compile_seconds FROM versions WHERE versions.id = events.version_id) "
        "WHERE kind = 'hit'"
    )

    op.execute(
        "INSERT INTO events (at, kind, bytes) "
        "SELECT MIN(created_at), 'stored', SUM(stored_size) FROM blobs HAVING COUNT(*) > 0"
    )


def downgrade() -> None:
    op.execute("DELETE FROM events WHERE kind IN ('stored', 'freed')")
    op.execute("DELETE FROM version_files WHERE version_id IN (SELECT id FROM versions WHERE state = 'purged')")
    op.execute("DELETE FROM versions WHERE state = 'purged'")
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_column('seconds')
    with op.batch_alter_table('versions', schema=None) as batch_op:
        batch_op.drop_column('purged_at')

    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_index('ix_audit_log_at')

    op.drop_table('audit_log')
    op.drop_table('tokens')
