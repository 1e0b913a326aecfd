"""Column groups that several migrations create alike (a run's lifecycle, a queue row, a job's child row).

Each call returns new Column objects (a Column belongs to one table). What a helper returns is part of every
migration that already calls it: never change one; add a new helper for a new shape.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

Column = sa.Column[Any]


def _when(name: str, *, nullable: bool) -> Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def seq_and_id() -> list[Column]:
    """The row's insertion order (the primary key) and its public id (jobs, files, exports)."""
    return [
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id", sa.String(length=40), nullable=False),
    ]


def seq_key_and_unique_id() -> list[sa.Constraint]:
    return [sa.PrimaryKeyConstraint("seq"), sa.UniqueConstraint("id")]


def owner() -> Column:
    return sa.Column("owner", sa.String(length=128), nullable=False)


def created_at() -> Column:
    return _when("created_at", nullable=False)


def job_id() -> Column:
    return sa.Column("job_id", sa.String(length=40), nullable=False)


def job_id_cascade() -> sa.ForeignKeyConstraint:
    """A child row of a job: it goes when the job goes."""
    return sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE")


def launched_run() -> list[Column]:
    """A launched run's times and handle (jobs and exports): created_at ... resources."""
    return [
        created_at(),
        _when("updated_at", nullable=False),
        _when("started_at", nullable=True),
        _when("finished_at", nullable=True),
        _when("cancel_requested_at", nullable=True),
        sa.Column("external_id", sa.String(length=64), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("pid_start_ticks", sa.BigInteger(), nullable=True),
        sa.Column("resources", sa.JSON(), nullable=True),
    ]


def run_failure() -> list[Column]:
    """How a run ended when it failed (jobs and exports)."""
    return [
        sa.Column("error_code", sa.String(length=32), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
    ]


def queue_place() -> list[Column]:
    """Why a queued job or export waits and when it may start (job_queue, export_queue)."""
    return [
        sa.Column("position", sa.Integer(), nullable=True),
        sa.Column("reason", sa.String(length=64), nullable=False),
        _when("estimated_start", nullable=True),
    ]
