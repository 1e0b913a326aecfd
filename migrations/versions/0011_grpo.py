"""Grpo: a sample's reward (GRPO's rollouts: prompt, completion and the grader's reward)."""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0011_grpo", "0010_openai_jobs"


def upgrade() -> None:
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reward", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_column("reward")
