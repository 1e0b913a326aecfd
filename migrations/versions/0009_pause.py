"""Jobs.pause_requested_at: a pause asked of a launched run, until its run has checkpointed and ended."""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0009_pause", "0008_export_queue"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("pause_requested_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("pause_requested_at")
