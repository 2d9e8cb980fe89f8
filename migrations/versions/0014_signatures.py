"""versions.signer_key, versions.signature: who signed a version (an Ed25519 signature of its manifest)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02 06:40:00

A builder with CACHESVC_SIGNING_KEY sends an Ed25519 signature of the version's
manifest and key (cachesvc_client.shared.signing); the service keeps it, checked for
shape only (bounded: an OpenSSH public key line and 88 base64 characters), and
clients that trust keys verify it. NULL: an unsigned version (every one before).
"""
from alembic import op
import sqlalchemy as sa


revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("signer_key", sa.String(length=1000), nullable=True))
        batch_op.add_column(sa.Column("signature", sa.String(length=100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("versions", schema=None) as batch_op:
        batch_op.drop_column("signature")
        batch_op.drop_column("signer_key")
