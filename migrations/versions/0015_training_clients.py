"""Tinker (issue 52): training clients (a LoRA resident in its own process, a run the one scheduler
places), the SDK's sessions, and the states and sampler weights they saved."""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0015_training_clients", "0014_deployments"


def upgrade() -> None:
    op.create_table(
        "training_clients",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=160), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("base", sa.String(length=512), nullable=False),
        sa.Column("launcher", sa.String(length=16), nullable=False),
        sa.Column("device", sa.String(length=8), nullable=False),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.Column("priority", sa.String(length=8), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("lora_rank", sa.Integer(), nullable=False),
        sa.Column("user_metadata", sa.JSON(), nullable=True),
        sa.Column("api_key", sa.String(length=128), nullable=False),
        sa.Column("endpoint", sa.String(length=256), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=False),
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
    with op.batch_alter_table("training_clients", schema=None) as batch_op:
        batch_op.create_index("ix_training_clients_owner", ["owner"], unique=False)
        batch_op.create_index("ix_training_clients_status", ["status"], unique=False)
    op.create_table(
        "tinker_sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("user_metadata", sa.JSON(), nullable=True),
        sa.Column("models", sa.Integer(), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("tinker_sessions", schema=None) as batch_op:
        batch_op.create_index("ix_tinker_sessions_owner", ["owner"], unique=False)
    op.create_table(
        "tinker_checkpoints",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("path", sa.String(length=512), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("model_id", sa.String(length=160), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("folder", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("path"),
    )
    with op.batch_alter_table("tinker_checkpoints", schema=None) as batch_op:
        batch_op.create_index("ix_tinker_checkpoints_owner_model", ["owner", "model_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("tinker_checkpoints", schema=None) as batch_op:
        batch_op.drop_index("ix_tinker_checkpoints_owner_model")
    op.drop_table("tinker_checkpoints")
    with op.batch_alter_table("tinker_sessions", schema=None) as batch_op:
        batch_op.drop_index("ix_tinker_sessions_owner")
    op.drop_table("tinker_sessions")
    with op.batch_alter_table("training_clients", schema=None) as batch_op:
        batch_op.drop_index("ix_training_clients_status")
        batch_op.drop_index("ix_training_clients_owner")
    op.drop_table("training_clients")
