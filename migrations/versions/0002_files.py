"""Files: uploaded dataset files (POST /files)."""

import sqlalchemy as sa
from alembic import op

from migrations import columns

revision, down_revision = "0002_files", "0001"


def upgrade() -> None:
    op.create_table(
        "files",
        *columns.seq_and_id(),
        columns.owner(),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=True),
        sa.Column("columns", sa.JSON(), nullable=True),
        sa.Column("formats", sa.JSON(), nullable=True),
        sa.Column("methods", sa.JSON(), nullable=True),
        sa.Column("errors", sa.JSON(), nullable=True),
        sa.Column("error_count", sa.Integer(), nullable=False),
        columns.created_at(),
        sa.Column("validated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("validation_sent_at", sa.DateTime(timezone=True), nullable=True),
        *columns.seq_key_and_unique_id(),
    )
    with op.batch_alter_table("files", schema=None) as batch_op:
        batch_op.create_index("ix_files_owner_seq", ["owner", "seq"], unique=False)
        batch_op.create_index("ix_files_status_sent", ["status", "validation_sent_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("files", schema=None) as batch_op:
        batch_op.drop_index("ix_files_status_sent")
        batch_op.drop_index("ix_files_owner_seq")
    op.drop_table("files")
