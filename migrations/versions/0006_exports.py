"""exports: one row per export of a job's final/ (merged or adapter, in a dtype)

Revision ID: 0006_exports
Revises: 0005_point_extra
Create Date: 2026-12-01 13:50:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_exports"
down_revision = "0005_point_extra"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "exports",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("dtype", sa.String(length=8), nullable=False),
        sa.Column("max_shard_size", sa.String(length=16), nullable=False),
        sa.Column("push_to_hub", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("external_id", sa.String(length=64), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("pid_start_ticks", sa.BigInteger(), nullable=True),
        sa.Column("resources", sa.JSON(), nullable=True),
        sa.Column("error_code", sa.String(length=32), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("id"),
    )
    with op.batch_alter_table("exports", schema=None) as batch_op:
        batch_op.create_index("ix_exports_job_seq", ["job_id", "seq"], unique=False)
        batch_op.create_index("ix_exports_status", ["status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("exports", schema=None) as batch_op:
        batch_op.drop_index("ix_exports_status")
        batch_op.drop_index("ix_exports_job_seq")
    op.drop_table("exports")
