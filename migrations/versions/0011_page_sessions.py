"""page_sessions: sign-ins on the pages that the server can end (sign-out deletes the row)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 07:00:00

Before, the signed cookie alone was the session: sign-out cleared the browser's copy, and a copied
cookie still opened the admin pages until it expired. Sessions that existed before this migration
carry no id and end at their next request (their people sign in again).
"""
from alembic import op
import sqlalchemy as sa


revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "page_sessions",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["token_id"], ["tokens.id"]),
        sa.PrimaryKeyConstraint("id_hash"),
    )
    op.create_index("ix_page_sessions_token_id", "page_sessions", ["token_id"], unique=False)
    op.create_index("ix_page_sessions_expires_at", "page_sessions", ["expires_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_page_sessions_expires_at", table_name="page_sessions")
    op.drop_index("ix_page_sessions_token_id", table_name="page_sessions")
    op.drop_table("page_sessions")
