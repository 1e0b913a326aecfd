"""openai_jobs: what a job created through the OpenAI-compatible /v1 API asked for beyond its spec

Revision ID: 0010_openai_jobs
Revises: 0009_pause
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_openai_jobs"
down_revision = "0009_pause"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "openai_jobs",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("suffix", sa.String(length=64), nullable=True),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("method", sa.JSON(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("integrations", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id"),
    )


def downgrade() -> None:
    op.drop_table("openai_jobs")
