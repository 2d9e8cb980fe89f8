"""page_sessions.flash: what a page's POST leaves for the GET it redirects to, kept on the server

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02 13:30:00

A token created on the tokens page is shown once, on the page the POST redirects to
(post-redirect-get). It travelled there in the session cookie, which is signed, not encrypted:
the token sat readable in the browser's cookie jar and in every proxy log of that request. It
now waits in the sign-in's own row, which the GET empties as it shows it (and sign-out deletes).
"""
from alembic import op
import sqlalchemy as sa


revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("page_sessions") as batch:
        batch.add_column(sa.Column("flash", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("page_sessions") as batch:
        batch.drop_column("flash")
