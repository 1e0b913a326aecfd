"""Openai_jobs: what a job created through the OpenAI-compatible /v1 API asked for beyond its spec."""

import sqlalchemy as sa
from alembic import op

from migrations import columns

revision, down_revision = "0010_openai_jobs", "0009_pause"


def upgrade() -> None:
    op.create_table(
        "openai_jobs",
        columns.job_id(),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("suffix", sa.String(length=64), nullable=True),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("method", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("integrations", sa.JSON(), nullable=True),
        columns.job_id_cascade(),
        sa.PrimaryKeyConstraint("job_id"),
    )


def downgrade() -> None:
    op.drop_table("openai_jobs")
