"""Exports: one row per export of a job's final/ (merged or adapter, in a dtype)."""

import sqlalchemy as sa
from alembic import op

from migrations import columns

revision, down_revision = "0006_exports", "0005_point_extra"


def upgrade() -> None:
    op.create_table(
        "exports",
        *columns.seq_and_id(),
        columns.job_id(),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("dtype", sa.String(length=8), nullable=False),
        sa.Column("max_shard_size", sa.String(length=16), nullable=False),
        sa.Column("push_to_hub", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        *columns.launched_run(),
        *columns.run_failure(),
        columns.job_id_cascade(),
        *columns.seq_key_and_unique_id(),
    )
    with op.batch_alter_table("exports", schema=None) as batch_op:
        batch_op.create_index("ix_exports_job_seq", ["job_id", "seq"], unique=False)
        batch_op.create_index("ix_exports_status", ["status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("exports", schema=None) as batch_op:
        batch_op.drop_index("ix_exports_status")
        batch_op.drop_index("ix_exports_job_seq")
    op.drop_table("exports")
