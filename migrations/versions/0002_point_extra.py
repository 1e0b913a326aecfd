"""point extra: a metric point's method metrics beyond the fixed fields (TRL's names)

Revision ID: 0002_point_extra
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_point_extra"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.add_column(sa.Column("extra", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("metric_points", schema=None) as batch_op:
        batch_op.drop_column("extra")
