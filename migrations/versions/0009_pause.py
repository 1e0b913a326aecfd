"""jobs.pause_requested_at: a pause asked of a launched run, until its run has checkpointed and ended

Revision ID: 0009_pause
Revises: 0008_export_queue
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_pause"
down_revision = "0008_export_queue"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("pause_requested_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("pause_requested_at")
