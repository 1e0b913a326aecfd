"""Job events, webhooks and their deliveries (the webhook outbox)."""

import sqlalchemy as sa
from alembic import op

from migrations import columns

revision, down_revision = "0007_events", "0006_exports"

# A 64-bit id that SQLite still numbers itself (only its INTEGER PRIMARY KEY is the rowid).
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "job_events",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        columns.job_id(),
        columns.owner(),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("key", sa.String(length=160), nullable=True),
        columns.job_id_cascade(),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "key", name="uq_job_events_job_id_key"),
    )
    op.create_index("ix_job_events_job_id_id", "job_events", ["job_id", "id"])
    op.create_index("ix_job_events_owner_id", "job_events", ["owner", "id"])

    op.create_table(
        "webhooks",
        sa.Column("id", sa.String(length=40), nullable=False),
        columns.owner(),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        columns.created_at(),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhooks_owner", "webhooks", ["owner"])

    op.create_table(
        "webhook_deliveries",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("webhook_id", sa.String(length=40), nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        columns.job_id(),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        columns.created_at(),
        sa.Column("first_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["webhook_id"], ["webhooks.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["event_id"], ["job_events.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["status", "next_attempt_at"])
    op.create_index("ix_webhook_deliveries_order", "webhook_deliveries", ["webhook_id", "job_id", "event_id"])
    op.create_index("ix_webhook_deliveries_webhook_id_id", "webhook_deliveries", ["webhook_id", "id"])


def downgrade() -> None:
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_webhooks_owner", table_name="webhooks")
    op.drop_table("webhooks")
    op.drop_table("job_events")
