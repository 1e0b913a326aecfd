"""point extra: a metric point's method metrics beyond the fixed fields (TRL's names)

Revision ID: 0005_point_extra
Revises: 0004_samples
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_point_extra"
down_revision = "0004_samples"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.add_column(sa.Column("extra", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.drop_column("extra")
