"""Every SQL statement about exports.

`ExportRepository(session, owner)` is what the API uses: every read goes through `_readable()`, which
joins the export's job and filters on its owner, the one place the owner filter is applied to exports.
The module-level functions are the worker's (and the scheduler's reads); an export's transitions are
`EXPORTS`, the one compare-and-set mechanism of every kind of run (`ftq.store.transitions.RunTable`) on
this table.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Select, false, func, select, update
from sqlalchemy.orm import Session

from ftq.contract.status import LAUNCHED, JobStatus
from ftq.store.db import lock_for_transaction
from ftq.store.models import Dispatch, Evaluation, Export, ExportQueue, Job
from ftq.store.repository import account_other_run
from ftq.store.transitions import RunTable

# The outbox's dispatch kind that wakes the worker's export sweep (`ftq.runtime.queue.TASK_EXPORTS`).
DISPATCH_KIND = "export"
# An export that is one of these is what a second identical request gets back instead of a new one.
REUSABLE = (JobStatus.queued, JobStatus.starting, JobStatus.running, JobStatus.succeeded)


def new_export_id() -> str:
    return "exp_" + secrets.token_hex(8)


class ExportRepository:
    def __init__(self, session: Session, owner: str):
        self.session = session
        self.owner = owner

    def _readable(self) -> Select[Any]:
        return select(Export).join(Job, Job.id == Export.job_id).where(Job.owner == self.owner)

    def hold_queue(self) -> None:
        """Hold this owner's export queue until the transaction ends, so that two requests together
        cannot both pass the cap on queued exports: a transaction-scoped advisory lock per owner on
        PostgreSQL; on SQLite, the database's write lock, taken now by a write that changes no row."""
        if not lock_for_transaction(self.session, f"export-queue:{self.owner}"):
            self.session.execute(update(Export).where(false()).values(kind=Export.kind))

    def queued_count(self) -> int:
        """This owner's exports waiting for a device (queued), over all its jobs."""
        stmt = self._readable().where(Export.status == JobStatus.queued).with_only_columns(func.count())
        return int(self.session.scalar(stmt) or 0)

    def usage_rows(
        self, since: datetime | None, until: datetime | None
    ) -> list[tuple[str, datetime, float, str]]:
        """(owner, finished_at, device_seconds, device) of this owner's exports that ran and ended in
        [since, until): one device each, from launch to end."""
        return side_usage_rows(self.session, self.owner, Export, since, until)

    def get(self, job_id: str, export_id: str) -> Export | None:
        stmt = self._readable().where(Export.job_id == job_id, Export.id == export_id)
        return self.session.scalars(stmt).first()

    def list_for(self, job_id: str) -> list[Export]:
        """The job's exports, newest first."""
        stmt = self._readable().where(Export.job_id == job_id).order_by(Export.seq.desc())
        return list(self.session.scalars(stmt))

    def queue_of(self, export_ids: Sequence[str]) -> dict[str, ExportQueue]:
        """The scheduler's rows for these exports of this owner's (why each waits)."""
        if not export_ids:
            return {}
        stmt = (
            select(ExportQueue)
            .join(Export, Export.id == ExportQueue.export_id)
            .join(Job, Job.id == Export.job_id)
            .where(Job.owner == self.owner, ExportQueue.export_id.in_(list(export_ids)))
        )
        return {row.export_id: row for row in self.session.scalars(stmt)}

    def find_same(
        self,
        job_id: str,
        *,
        kind: str,
        dtype: str,
        max_shard_size: str,
        push_to_hub: dict[str, Any] | None,
        step: int | None = None,
    ) -> Export | None:
        """The newest export of this job with the same request that is under way or has succeeded."""
        stmt = self._readable().where(
            Export.job_id == job_id,
            Export.step.is_(None) if step is None else Export.step == step,
            Export.kind == kind,
            Export.dtype == dtype,
            Export.max_shard_size == max_shard_size,
            Export.status.in_([str(s) for s in REUSABLE]),
        )
        found: list[Export] = list(self.session.scalars(stmt.order_by(Export.seq.desc())))
        return next((e for e in found if (e.push_to_hub or None) == (push_to_hub or None)), None)

    def add_with_dispatch(self, export: Export) -> Dispatch:
        """The export and the dispatch that wakes the worker, in the caller's transaction."""
        self.session.add(export)
        self.session.flush()
        dispatch = Dispatch(
            job_id=export.job_id, kind=DISPATCH_KIND, created_at=export.created_at, attempts=0
        )
        self.session.add(dispatch)
        self.session.flush()
        return dispatch


# System operations (the worker, for every owner) -----------------------------------------------------


def get_export(session: Session, export_id: str) -> Export | None:
    return session.scalars(select(Export).where(Export.id == export_id)).first()


def exports_in(session: Session, statuses: Iterable[str]) -> list[Export]:
    stmt = select(Export).where(Export.status.in_([str(s) for s in statuses]))
    return list(session.scalars(stmt.order_by(Export.seq)))


# A run of a job's that is not its training (an export, an evaluation): one process on its job's launcher
# and device, its owner and priority its job's. The statements below serve every such table.
SideRun = type[Export] | type[Evaluation]


def queued_for_scheduling(session: Session, table: SideRun = Export) -> list[Any]:
    """Every queued export (or row of `table`) with what the scheduler weighs of it and of its job: (id,
    seq, created_at, owner, launcher, device, priority), oldest first."""
    stmt = (
        select(table.id, table.seq, table.created_at, Job.owner, Job.launcher, Job.device, Job.priority)
        .join(Job, Job.id == table.job_id)
        .where(table.status == JobStatus.queued)
    )
    return list(session.execute(stmt.order_by(table.seq)))


def holding_devices(session: Session, table: SideRun = Export) -> list[Any]:
    """Exports (or rows of `table`) holding local devices: (id, owner, resources, started_at), the owner
    their job's."""
    stmt = (
        select(table.id, Job.owner, table.resources, table.started_at)
        .join(Job, Job.id == table.job_id)
        .where(table.status.in_([str(s) for s in LAUNCHED]), table.resources.is_not(None))
    )
    return [r for r in session.execute(stmt) if r.resources]


def side_usage_rows(
    session: Session, owner: str, table: SideRun, since: datetime | None, until: datetime | None
) -> list[tuple[str, datetime, float, str]]:
    """`usage_rows` of an owner's exports or evaluations (`table`): one device each, launch to end."""
    stmt = (
        select(Job.owner, table.started_at, table.finished_at, Job.device)
        .join(Job, Job.id == table.job_id)
        .where(Job.owner == owner, table.started_at.is_not(None), table.finished_at.is_not(None))
    )
    if since is not None:
        stmt = stmt.where(table.finished_at >= since)
    if until is not None:
        stmt = stmt.where(table.finished_at < until)
    return [
        (o, f, export_device_seconds(s, f), dev)
        for o, s, f, dev in session.execute(stmt)
        if s is not None and f is not None
    ]


def export_device_seconds(started: datetime, finished: datetime) -> float:
    """An export holds one device from its launch to its end."""
    return max(0.0, (finished - started).total_seconds())


def account_side_run(
    session: Session,
    row_id: str,
    *,
    run_started: datetime | None = None,
    run_ended: datetime | None = None,
    table: SideRun = Export,
) -> None:
    """EXPORTS' `on_ended` (and EVALUATIONS'): a run that ran counts in its owner's usage (fair share, the
    period's GPU seconds), as a job's run does."""
    row = session.execute(
        select(Job.owner, Job.device, table.started_at, table.finished_at)
        .join(Job, Job.id == table.job_id)
        .where(table.id == row_id)
    ).one_or_none()
    if row is None:
        return
    start, end = run_started or row.started_at, run_ended or row.finished_at
    if start is None or end is None:
        return
    account_other_run(
        session, row.owner, device_seconds=export_device_seconds(start, end), cuda=row.device == "cuda"
    )


# An export's transitions (no events of its own; its cancel's dispatch wakes the export sweep); its end
# is accounted in its owner's usage.
EXPORTS = RunTable(Export, cancel_dispatch=DISPATCH_KIND, on_ended=account_side_run)


def request_cancel(session: Session, export: Export) -> str | None:
    """The API's cancel of an export: its dispatch is about the export's job."""
    return EXPORTS.request_cancel(session, export.id, job_id=export.job_id)
