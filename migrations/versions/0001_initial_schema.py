"""Initial schema: jobs, their dispatches and metric points, idempotency keys."""

import sqlalchemy as sa
from alembic import op

from migrations import columns

revision, down_revision = "0001", None


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        columns.owner(),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=True),
        columns.created_at(),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("owner", "key"),
    )
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_idempotency_keys_expires_at"), ["expires_at"], unique=False)

    op.create_table(
        "jobs",
        *columns.seq_and_id(),
        sa.Column("name", sa.String(length=64), nullable=False),
        columns.owner(),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=True),
        sa.Column("launcher", sa.String(length=16), nullable=False),
        sa.Column("device", sa.String(length=8), nullable=False),
        *columns.launched_run(),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("metrics_offset", sa.BigInteger(), nullable=False),
        sa.Column("progress_step", sa.Integer(), nullable=True),
        sa.Column("progress_max_steps", sa.Integer(), nullable=True),
        sa.Column("progress_epoch", sa.Float(), nullable=True),
        sa.Column("eta_seconds", sa.Float(), nullable=True),
        sa.Column("latest_metrics", sa.JSON(), nullable=True),
        *columns.run_failure(),
        *columns.seq_key_and_unique_id(),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_owner_seq", ["owner", "seq"], unique=False)
        batch_op.create_index("ix_jobs_owner_status_seq", ["owner", "status", "seq"], unique=False)
        batch_op.create_index("ix_jobs_status", ["status"], unique=False)

    op.create_table(
        "dispatches",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        columns.job_id(),
        sa.Column("kind", sa.String(length=16), nullable=False),
        columns.created_at(),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        columns.job_id_cascade(),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("dispatches", schema=None) as batch_op:
        batch_op.create_index("ix_dispatches_unsent", ["sent_at", "id"], unique=False)

    op.create_table(
        "metric_points",
        columns.job_id(),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Float(), nullable=True),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("learning_rate", sa.Float(), nullable=True),
        sa.Column("grad_norm", sa.Float(), nullable=True),
        sa.Column("eval_loss", sa.Float(), nullable=True),
        sa.Column("tokens_per_second", sa.Float(), nullable=True),
        sa.Column("time", sa.Float(), nullable=True),
        columns.job_id_cascade(),
        sa.PrimaryKeyConstraint("job_id", "step"),
    )


def downgrade() -> None:
    op.drop_table("metric_points")
    with op.batch_alter_table("dispatches", schema=None) as batch_op:
        batch_op.drop_index("ix_dispatches_unsent")

    op.drop_table("dispatches")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_status")
        batch_op.drop_index("ix_jobs_owner_status_seq")
        batch_op.drop_index("ix_jobs_owner_seq")

    op.drop_table("jobs")
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_idempotency_keys_expires_at"))

    op.drop_table("idempotency_keys")
