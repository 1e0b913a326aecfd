"""OpenAI-compatible uploads (`/v1/uploads`) and their parts, in the store instead of JSON files beside
the parts: `complete` claims an upload by a compare-and-set on its status, and the parts' bytes count in
the owner's file quota from their rows."""

import sqlalchemy as sa
from alembic import op

from migrations import columns

revision, down_revision = "0013_uploads", "0012_evaluations"


def upgrade() -> None:
    op.create_table(
        "uploads",
        *columns.seq_and_id(),
        columns.owner(),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("purpose", sa.String(length=64), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("mime_type", sa.String(length=255), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        columns.created_at(),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("file_id", sa.String(length=40), nullable=True),
        *columns.seq_key_and_unique_id(),
    )
    with op.batch_alter_table("uploads", schema=None) as batch_op:
        batch_op.create_index("ix_uploads_owner_status", ["owner", "status"], unique=False)
        batch_op.create_index("ix_uploads_status_expires", ["status", "expires_at"], unique=False)
    op.create_table(
        "upload_parts",
        *columns.seq_and_id(),
        sa.Column("upload_id", sa.String(length=40), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("path", sa.String(length=255), nullable=False),
        columns.created_at(),
        sa.ForeignKeyConstraint(["upload_id"], ["uploads.id"], ondelete="CASCADE"),
        *columns.seq_key_and_unique_id(),
    )
    with op.batch_alter_table("upload_parts", schema=None) as batch_op:
        batch_op.create_index("ix_upload_parts_upload_seq", ["upload_id", "seq"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("upload_parts", schema=None) as batch_op:
        batch_op.drop_index("ix_upload_parts_upload_seq")
    op.drop_table("upload_parts")
    with op.batch_alter_table("uploads", schema=None) as batch_op:
        batch_op.drop_index("ix_uploads_status_expires")
        batch_op.drop_index("ix_uploads_owner_status")
    op.drop_table("uploads")
