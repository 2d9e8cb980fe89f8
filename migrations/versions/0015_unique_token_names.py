"""tokens: one active token per name (a partial unique index), so `token revoke NAME` revokes one

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 07:00:00

Names could repeat, and revoking by name revoked every token of that name. Active
tokens that share a name keep the oldest one's name; the others get `-<id>` appended
(`ci`, `ci-7`), so nothing is revoked or lost and each can be revoked by name.
Revoked tokens are left alone: a name may be given again once its token is revoked.
"""
from alembic import op
import sqlalchemy as sa


revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

ACTIVE = sa.text("revoked_at IS NULL")


def upgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, name FROM tokens WHERE revoked_at IS NULL ORDER BY id")).all()
    taken, seen = {name for _, name in rows}, set()
    for ident, name in rows:
        if name in seen:
            new = name
            while new in taken:  # `ci-7` may already be another active token's name
                new = f"{new[:100 - len(str(ident)) - 1]}-{ident}"
            conn.execute(sa.text("UPDATE tokens SET name = :name WHERE id = :id"), {"name": new, "id": ident})
            taken.add(new)
        seen.add(name)
    op.create_index("uq_tokens_active_name", "tokens", ["name"], unique=True, sqlite_where=ACTIVE,
                    postgresql_where=ACTIVE)


def downgrade() -> None:
    op.drop_index("uq_tokens_active_name", table_name="tokens")
