"""Every SQL statement that is the same for each kind of side run: a run of a job's that is not its
training (an export, an evaluation), one process on its job's launcher and device, its owner and priority
its job's. `ftq.store.exports` and `ftq.store.evaluations` add what is their own; their transitions are
each a `ftq.store.transitions.RunTable` on their table, the one compare-and-set mechanism.

`SideRunRepository(session, owner)` is the API's: every read goes through `_readable()`, which joins the
row's job and filters on its owner, the one place the owner filter is applied to side runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, ClassVar, Generic, TypeVar

from sqlalchemy import Select, false, func, select, update
from sqlalchemy.orm import Session

from ftq.contract.status import LAUNCHED, JobStatus
from ftq.store.db import lock_for_transaction
from ftq.store.models import Dispatch, Evaluation, EvaluationQueue, Export, ExportQueue, Job
from ftq.store.owned import OwnedRepository
from ftq.store.repository import account_other_run
from ftq.store.transitions import RunTable, utcnow

SideRun = type[Export] | type[Evaluation]
Row = TypeVar("Row", Export, Evaluation)
Queue = TypeVar("Queue", ExportQueue, EvaluationQueue)


class SideRunRepository(OwnedRepository, Generic[Row, Queue]):
    """An owner's side runs of one table (its `transitions`' table), the scheduler's rows for them (`queue`,
    keyed by `<noun>_id`); `noun` also names the owner's queue lock. A kind names them in its class line:
    `class ExportRepository(SideRunRepository[...], queue=ExportQueue, noun="export", transitions=...)`."""

    table: ClassVar[Any]
    queue_table: ClassVar[Any]
    queue_key: ClassVar[str]
    noun: ClassVar[str]
    transitions: ClassVar[RunTable]

    def __init_subclass__(
        cls, *, queue: type[Queue], noun: str, transitions: RunTable, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        cls.table, cls.queue_table, cls.noun, cls.transitions = transitions.table, queue, noun, transitions
        cls.queue_key = f"{noun}_id"

    def _select(self) -> Select[Any]:
        return select(self.table).join(Job, Job.id == self.table.job_id)

    def _owner_column(self) -> Any:
        return Job.owner

    def get(self, job_id: str, row_id: str) -> Row | None:
        stmt = self._readable().where(self.table.job_id == job_id, self.table.id == row_id)
        row: Row | None = self.session.scalars(stmt).first()
        return row

    def list_for(self, job_id: str) -> list[Row]:
        """The job's rows, newest first."""
        stmt = self._readable().where(self.table.job_id == job_id).order_by(self.table.seq.desc())
        return list(self.session.scalars(stmt))

    def queue_of(self, ids: Sequence[str]) -> dict[str, Queue]:
        """The scheduler's rows for these runs of this owner's (why each waits)."""
        if not ids:
            return {}
        key = getattr(self.queue_table, self.queue_key)
        stmt = (
            select(self.queue_table)
            .join(self.table, self.table.id == key)
            .join(Job, Job.id == self.table.job_id)
            .where(Job.owner == self.owner, key.in_(list(ids)))
        )
        return {getattr(row, self.queue_key): row for row in self.session.scalars(stmt)}

    def hold_queue(self) -> None:
        """Hold this owner's queue of this kind until the transaction ends, so that two requests together
        cannot both pass the cap on queued runs: a transaction-scoped advisory lock per owner on
        PostgreSQL; on SQLite, the database's write lock, taken now by a write that changes no row."""
        if not lock_for_transaction(self.session, f"{self.noun}-queue:{self.owner}"):
            self.session.execute(update(self.table).where(false()).values(status=self.table.status))

    def usage_rows(
        self, since: datetime | None, until: datetime | None
    ) -> list[tuple[str, datetime, float, str]]:
        """(owner, finished_at, device_seconds, device) of this owner's runs of this kind that ran and
        ended in [since, until): one device each, from launch to end."""
        return side_usage_rows(self.session, self.owner, self.table, since, until)

    def request_cancel(self, row: Row) -> str | None:
        """The API's cancel of one of these runs: its dispatch is about the row's job. The new status, or
        None when nothing changed (`ftq.store.transitions.RunTable.request_cancel`)."""
        return self.transitions.request_cancel(self.session, row.id, job_id=row.job_id)

    def queued_count(self, *where: Any) -> int:
        """This owner's runs of this kind waiting for a device (queued), over all its jobs (`where`: what
        else they must be)."""
        stmt = self._readable().where(self.table.status == JobStatus.queued, *where)
        return int(self.session.scalar(stmt.with_only_columns(func.count())) or 0)


# System operations (the worker, for every owner) -----------------------------------------------------


def add_queued(
    session: Session, table: SideRun, row_id: str, job_id: str, dispatch_kind: str, **fields: Any
) -> Any:
    """A new queued side run of `table` and the dispatch (`dispatch_kind`) that wakes the worker about its
    job, in the caller's transaction (`fields`: the row's own columns)."""
    now = utcnow()
    row = table(id=row_id, job_id=job_id, status=JobStatus.queued, created_at=now, updated_at=now, **fields)
    session.add(row)
    session.flush()
    session.add(Dispatch(job_id=job_id, kind=dispatch_kind, created_at=now, attempts=0))
    session.flush()
    return row


def get_row(session: Session, table: SideRun, row_id: str) -> Any:
    return session.scalars(select(table).where(table.id == row_id)).first()


def rows_in(session: Session, table: SideRun, statuses: Iterable[str]) -> list[Any]:
    stmt = select(table).where(table.status.in_([str(s) for s in statuses]))
    return list(session.scalars(stmt.order_by(table.seq)))


def queued_for_scheduling(session: Session, table: SideRun) -> list[Any]:
    """Every queued row of `table` with what the scheduler weighs of it and of its job: (id, seq,
    created_at, owner, launcher, device, priority), oldest first."""
    stmt = (
        select(table.id, table.seq, table.created_at, Job.owner, Job.launcher, Job.device, Job.priority)
        .join(Job, Job.id == table.job_id)
        .where(table.status == JobStatus.queued)
    )
    return list(session.execute(stmt.order_by(table.seq)))


def holding_devices(session: Session, table: SideRun) -> list[Any]:
    """Rows of `table` holding local devices: (id, owner, resources, started_at), the owner their job's."""
    stmt = (
        select(table.id, Job.owner, table.resources, table.started_at)
        .join(Job, Job.id == table.job_id)
        .where(table.status.in_([str(s) for s in LAUNCHED]), table.resources.is_not(None))
    )
    return [r for r in session.execute(stmt) if r.resources]


def side_usage_rows(
    session: Session, owner: str, table: SideRun, since: datetime | None, until: datetime | None
) -> list[tuple[str, datetime, float, str]]:
    """(owner, finished_at, device_seconds, device) of an owner's side runs of `table` that ran and ended
    in [since, until): their devices (one where not recorded) from launch to end."""
    stmt = (
        select(Job.owner, table.started_at, table.finished_at, Job.device, table.devices)
        .join(Job, Job.id == table.job_id)
        .where(Job.owner == owner, table.started_at.is_not(None), table.finished_at.is_not(None))
    )
    if since is not None:
        stmt = stmt.where(table.finished_at >= since)
    if until is not None:
        stmt = stmt.where(table.finished_at < until)
    return [
        (o, f, device_seconds(s, f, n), dev)
        for o, s, f, dev, n in session.execute(stmt)
        if s is not None and f is not None
    ]


def device_seconds(started: datetime, finished: datetime, devices: int | None = None) -> float:
    """A side run holds its devices (one where not recorded) from its launch to its end."""
    return max(0.0, (finished - started).total_seconds()) * max(1, devices or 1)


def record_devices(session: Session, table: SideRun, row_id: str, devices: int) -> None:
    """The devices a side run's launch runs on (written as it is launched), for its usage at its end."""
    session.execute(update(table).where(table.id == row_id).values(devices=devices))


def account_side_run(
    session: Session,
    row_id: str,
    *,
    run_started: datetime | None = None,
    run_ended: datetime | None = None,
    table: SideRun = Export,
) -> None:
    """A side-run table's `on_ended`: a run that ran counts in its owner's usage (fair share, the
    period's GPU seconds), as a job's run does."""
    row = session.execute(
        select(Job.owner, Job.device, table.started_at, table.finished_at, table.devices)
        .join(Job, Job.id == table.job_id)
        .where(table.id == row_id)
    ).one_or_none()
    if row is None:
        return
    start, end = run_started or row.started_at, run_ended or row.finished_at
    if start is None or end is None:
        return
    account_other_run(
        session,
        row.owner,
        device_seconds=device_seconds(start, end, row.devices),
        cuda=row.device == "cuda",
    )
