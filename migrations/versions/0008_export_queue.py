"""export_queue: why each queued export waits (exports are placed by the one scheduler with the jobs)

Revision ID: 0008_export_queue
Revises: 0007_events
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_export_queue"
down_revision = "0007_events"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "export_queue",
        sa.Column("export_id", sa.String(length=40), nullable=False),
        sa.Column("position", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("estimated_start", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["export_id"], ["exports.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("export_id"),
    )


def downgrade() -> None:
    op.drop_table("export_queue")
