"""Scheduling: priorities, queue positions, accounting."""

import sqlalchemy as sa
from alembic import op

from migrations import columns

revision, down_revision = "0003_scheduling", "0002_files"


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("priority", sa.String(length=8), nullable=True))
        batch_op.add_column(sa.Column("devices", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("limit_seconds", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("estimated_seconds", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("device_seconds", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("run_seconds", sa.Float(), nullable=True))
        batch_op.create_index("ix_jobs_finished_at", ["finished_at"], unique=False)
    op.create_table(
        "job_queue",
        columns.job_id(),
        *columns.queue_place(),
        columns.job_id_cascade(),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_table(
        "owner_usage",
        columns.owner(),
        sa.Column("recent_device_seconds", sa.Float(), nullable=False),
        sa.Column("recent_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("period_gpu_seconds", sa.Float(), nullable=False),
        sa.Column("total_device_seconds", sa.Float(), nullable=False),
        sa.Column("total_gpu_seconds", sa.Float(), nullable=False),
        sa.Column("total_jobs", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("owner"),
    )


def downgrade() -> None:
    op.drop_table("owner_usage")
    op.drop_table("job_queue")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_finished_at")
        for name in (
            "run_seconds",
            "device_seconds",
            "estimated_seconds",
            "limit_seconds",
            "devices",
            "priority",
        ):
            batch_op.drop_column(name)
