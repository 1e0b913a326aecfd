"""Evaluations: one row per evaluation of a job's checkpoint or final/ (eval.suites), and why each
queued one waits (the one scheduler places evaluations with jobs and exports)."""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0012_evaluations", "0011_grpo"


def upgrade() -> None:
    # An export of a checkpoint (exports' `checkpoint: <step> | best`); null: final/.
    with op.batch_alter_table("exports", schema=None) as batch_op:
        batch_op.add_column(sa.Column("step", sa.Integer(), nullable=True))
    op.create_table(
        "evaluations",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("suites", sa.JSON(), nullable=True),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=True),
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
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("seq"),
        sa.UniqueConstraint("id"),
    )
    with op.batch_alter_table("evaluations", schema=None) as batch_op:
        batch_op.create_index("ix_evaluations_job_seq", ["job_id", "seq"], unique=False)
        batch_op.create_index("ix_evaluations_status", ["status"], unique=False)
    op.create_table(
        "evaluation_queue",
        sa.Column("evaluation_id", sa.String(length=40), nullable=False),
        sa.Column("position", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("estimated_start", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["evaluation_id"], ["evaluations.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("evaluation_id"),
    )


def downgrade() -> None:
    op.drop_table("evaluation_queue")
    with op.batch_alter_table("evaluations", schema=None) as batch_op:
        batch_op.drop_index("ix_evaluations_status")
        batch_op.drop_index("ix_evaluations_job_seq")
    op.drop_table("evaluations")
    with op.batch_alter_table("exports", schema=None) as batch_op:
        batch_op.drop_column("step")
