"""demand_families, demand_shapes: the fleet's shape demand, reported by the processes that serve

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03 09:00:00

Processes running `cachesvc_client.compile` count the calls each input shape made and how each was
served (a package, torch.compile, the model itself) and report them (POST /api/v1/usage). The service
keeps the sums per key family (a key without its shape: name, tags, environment) and shape, so a build
job can build packages for the shapes the fleet really serves (GET /api/v1/demand). A shape is unique
in its family by its sha256: its text may be longer than a PostgreSQL btree row. No foreign key to
the entries: purging an entry leaves the demand of its model.
"""
from alembic import op
import sqlalchemy as sa


revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "demand_families",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("family_digest", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("tags", sa.Text(), nullable=False),
        sa.Column("torch", sa.String(length=200), nullable=False),
        sa.Column("triton", sa.String(length=200), nullable=False),
        sa.Column("cuda", sa.String(length=200), nullable=False),
        sa.Column("python", sa.String(length=200), nullable=False),
        sa.Column("device", sa.String(length=200), nullable=False),
        sa.Column("arch", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("family_digest", name="uq_demand_families_family_digest"),
    )
    op.create_index("ix_demand_families_name", "demand_families", ["name"], unique=False)
    op.create_table(
        "demand_shapes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("family_id", sa.Integer(), nullable=False),
        sa.Column("shape_digest", sa.String(length=64), nullable=False),
        sa.Column("shape", sa.Text(), nullable=False),
        sa.Column("package_calls", sa.BigInteger(), nullable=False),
        sa.Column("compile_calls", sa.BigInteger(), nullable=False),
        sa.Column("eager_calls", sa.BigInteger(), nullable=False),
        sa.Column("first_seen", sa.DateTime(), nullable=False),
        sa.Column("last_seen", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["family_id"], ["demand_families.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("family_id", "shape_digest", name="uq_demand_shapes_family_shape"),
    )


def downgrade() -> None:
    op.drop_table("demand_shapes")
    op.drop_index("ix_demand_families_name", table_name="demand_families")
    op.drop_table("demand_families")
