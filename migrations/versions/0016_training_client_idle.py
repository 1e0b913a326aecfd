"""Tinker training clients saved when idle (issue 52, second slice): the folder of the state an idle one
was saved to (its next call loads it in a new run), the device-seconds of its earlier runs (each run of
the row counts in /usage), and the training clients' own event log."""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0016_training_client_idle", "0015_training_clients"


def upgrade() -> None:
    with op.batch_alter_table("training_clients", schema=None) as batch_op:
        batch_op.add_column(sa.Column("idle_state", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("earlier_device_seconds", sa.Float(), nullable=True))
    op.create_table(
        "training_client_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model_id", sa.String(length=160), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("type", sa.String(length=40), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("training_client_events", schema=None) as batch_op:
        batch_op.create_index("ix_training_client_events_model", ["model_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("training_client_events", schema=None) as batch_op:
        batch_op.drop_index("ix_training_client_events_model")
    op.drop_table("training_client_events")
    with op.batch_alter_table("training_clients", schema=None) as batch_op:
        batch_op.drop_column("earlier_device_seconds")
        batch_op.drop_column("idle_state")
