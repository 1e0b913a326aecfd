"""Deployments: one row per serving engine (a base model served for one owner with their adapters), a run
the one scheduler places, and why each queued one waits."""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0014_deployments", "0013_uploads"


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("label", sa.String(length=512), nullable=False),
        sa.Column("launcher", sa.String(length=16), nullable=False),
        sa.Column("device", sa.String(length=8), nullable=False),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.Column("tensor_parallel_size", sa.Integer(), nullable=False),
        sa.Column("priority", sa.String(length=8), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("api_key", sa.String(length=128), nullable=False),
        sa.Column("endpoint", sa.String(length=256), nullable=True),
        sa.Column("ready_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("adapters", sa.JSON(), nullable=True),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("external_id", sa.String(length=64), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("pid_start_ticks", sa.BigInteger(), nullable=True),
        sa.Column("resources", sa.JSON(), nullable=True),
        sa.Column("error_code", sa.String(length=32), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("id"),
    )
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.create_index("ix_deployments_owner_key", ["owner", "key"], unique=False)
        batch_op.create_index("ix_deployments_status", ["status"], unique=False)
    op.create_table(
        "deployment_queue",
        sa.Column("deployment_id", sa.String(length=40), nullable=False),
        sa.Column("position", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("estimated_start", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["deployment_id"], ["deployments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("deployment_id"),
    )


def downgrade() -> None:
    op.drop_table("deployment_queue")
    with op.batch_alter_table("deployments", schema=None) as batch_op:
        batch_op.drop_index("ix_deployments_status")
        batch_op.drop_index("ix_deployments_owner_key")
    op.drop_table("deployments")
