"""Export_queue: why each queued export waits (exports are placed by the one scheduler with the jobs)."""

import sqlalchemy as sa
from alembic import op

from migrations import columns

revision, down_revision = "0008_export_queue", "0007_events"


def upgrade() -> None:
    op.create_table(
        "export_queue",
        sa.Column("export_id", sa.String(length=40), nullable=False),
        *columns.queue_place(),
        sa.ForeignKeyConstraint(["export_id"], ["exports.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("export_id"),
    )


def downgrade() -> None:
    op.drop_table("export_queue")
