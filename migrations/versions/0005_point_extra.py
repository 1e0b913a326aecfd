"""Point extra: a metric point's method metrics beyond the fixed fields (TRL's names)."""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0005_point_extra", "0004_samples"


def upgrade() -> None:
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.add_column(sa.Column("extra", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.drop_column("extra")
