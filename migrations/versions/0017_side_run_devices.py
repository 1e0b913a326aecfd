"""The devices an export or evaluation ran on (an evaluation of a large base takes several GPUs of a
node), written at its launch, so its end counts devices x time in its owner's usage."""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0017_side_run_devices", "0016_training_client_idle"


def upgrade() -> None:
    for table in ("exports", "evaluations"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("devices", sa.Integer(), nullable=True))


def downgrade() -> None:
    for table in ("exports", "evaluations"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("devices")
