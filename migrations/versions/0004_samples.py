"""Samples: completions of the spec's sample prompts during training, and the ingest offset."""

import sqlalchemy as sa
from alembic import op

from migrations import columns

revision, down_revision = "0004_samples", "0003_scheduling"


def upgrade() -> None:
    op.create_table(
        "samples",
        columns.job_id(),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("prompt_index", sa.Integer(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("completion", sa.Text(), nullable=False),
        sa.Column("time", sa.Float(), nullable=True),
        columns.job_id_cascade(),
        sa.PrimaryKeyConstraint("job_id", "step", "prompt_index"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("samples_offset", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("samples_offset")
    op.drop_table("samples")
