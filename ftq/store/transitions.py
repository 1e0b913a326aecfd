"""The one compare-and-set mechanism for every table whose rows go through `ftq.contract.status`'s
states: a job's run (`ftq.store.repository.JOBS`), an export (`ftq.store.exports.EXPORTS`), an evaluation
(`ftq.store.evaluations.EVALUATIONS`), and any later kind of run alike.

A `RunTable` names each transition. Each is one UPDATE ... WHERE status IN (from), so a sweep or task
that runs twice changes nothing the second time, and an edge `ftq.contract.status.TRANSITIONS` lacks is a
ValueError before any SQL, so no caller can write one. What a table does besides the status (a job's
events, the accounting of its end) are its hooks, run in the transaction of the change: both commit, or
neither.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypedDict, Unpack

from sqlalchemy import CursorResult, Result, update
from sqlalchemy.orm import Session

from ftq.contract.status import LAUNCHED, TERMINAL, JobStatus, can_move, sources_of
from ftq.runtime.redact import redact
from ftq.store.models import Deployment, Dispatch, Evaluation, Export, Job, TrainingClient

# The tables whose rows go through ftq.contract.status's states.
Tracked = type[Job] | type[Export] | type[Evaluation] | type[Deployment] | type[TrainingClient]
# What a row claimed but never launched gives back: its claim and any launch handle.
UNCLAIMED: dict[str, Any] = {"resources": None, "pid": None, "pid_start_ticks": None, "external_id": None}


class Handle(TypedDict):
    """How to find a launched run again: the scheduler's job id, or the local process and its start."""

    external_id: str | None
    pid: int | None
    pid_start_ticks: int | None


def utcnow() -> datetime:
    return datetime.now(UTC)


class OnMoved(Protocol):
    """Called in the transaction of a change: the row moved to `to`, writing `values`."""

    def __call__(
        self, session: Session, row_id: str, to: JobStatus, values: dict[str, Any], /, *, reason: str | None
    ) -> None: ...


class OnEnded(Protocol):
    """Called in the transaction of a move to a terminal status (`run_started`/`run_ended`: the run's own
    start and end where its scheduler knows them)."""

    def __call__(
        self, session: Session, row_id: str, /, *, run_started: datetime | None, run_ended: datetime | None
    ) -> None: ...


def rowcount(result: Result[Any]) -> int:
    """Rows an UPDATE or DELETE matched: only a cursor result carries the count."""
    if not isinstance(result, CursorResult):
        raise TypeError(f"expected the result of an UPDATE or DELETE, got {type(result).__name__}")
    return int(result.rowcount or 0)


def _update(
    session: Session, table: Tracked, row_id: str, from_: list[str], to: str, values: dict[str, Any]
) -> bool:
    stmt = (
        update(table)
        .where(table.id == row_id, table.status.in_([str(s) for s in from_]))
        .values(status=to, updated_at=utcnow(), **values)
        .execution_options(synchronize_session=False)
    )
    return rowcount(session.execute(stmt)) == 1


@dataclass(frozen=True)
class RunTable:
    """The transitions of one table of runs. `cancel_dispatch`: the outbox dispatch kind that wakes the
    worker to cancel one of its rows; `queue_dispatch`, the scheduler for one resumed."""

    table: Tracked
    cancel_dispatch: str | None  # None: a table whose rows have no job to dispatch about (the caller wakes
    # the worker itself)
    queue_dispatch: str = "submit"  # the dispatch that wakes the scheduler for a row queued again
    on_moved: OnMoved | None = None
    on_ended: OnEnded | None = None

    def move(
        self,
        session: Session,
        row_id: str,
        from_: Iterable[str],
        to: str,
        *,
        reason: str | None = None,
        **values: Any,
    ) -> bool:
        """Move one row from any of `from_` to `to`, or change nothing: True when this call moved it.
        `reason`: why, for the table's `on_moved` (a job's retried event)."""
        from_ = list(from_)
        illegal = [s for s in from_ if not can_move(s, to)]
        if illegal:
            raise ValueError(f"no transition {illegal[0]} -> {to} (see ftq.contract.status.TRANSITIONS)")
        moved = _update(session, self.table, row_id, from_, to, values)
        if moved and self.on_moved is not None:
            self.on_moved(session, row_id, JobStatus(to), values, reason=reason)
        return moved

    def mark_starting(self, session: Session, row_id: str, *, resources: dict[str, Any] | None) -> bool:
        """queued -> starting, with the devices claimed: the worker that wins this owns the launch; any
        other copy backs off."""
        return self.move(session, row_id, [JobStatus.queued], JobStatus.starting, resources=resources)

    def record_launch(self, session: Session, row_id: str, **handle: Unpack[Handle]) -> bool:
        """Store the launch handle, status unchanged, while the row may already be `cancelling` (a cancel
        raced the launch)."""
        stmt = (
            update(self.table)
            .where(self.table.id == row_id, self.table.status.in_([str(s) for s in LAUNCHED]))
            .values(**handle, updated_at=utcnow())
        )
        return rowcount(session.execute(stmt)) == 1

    def mark_running(self, session: Session, row_id: str, **handle: Unpack[Handle]) -> bool:
        """starting -> running, with its launch handle; its start is now."""
        return self.move(
            session, row_id, [JobStatus.starting], JobStatus.running, started_at=utcnow(), **handle
        )

    def requeue(self, session: Session, row_id: str, *, reason: str | None = None, **values: Any) -> bool:
        """starting/running -> queued, giving back its claim: claimed but never launched (its worker
        stopped), or a failed run going round again (`values`: what else changes, a job's attempt)."""
        to_queue = [JobStatus.starting, JobStatus.running]
        return self.move(session, row_id, to_queue, JobStatus.queued, reason=reason, **UNCLAIMED, **values)

    def mark_finished(
        self,
        session: Session,
        row_id: str,
        status: JobStatus,
        *,
        error_code: str | None = None,
        error_message: str | None = None,
        exit_code: int | None = None,
        run_started: datetime | None = None,
        run_ended: datetime | None = None,
    ) -> bool:
        """-> succeeded | failed | cancelled, from every state that may end so (a queued row fails or is
        cancelled, never succeeds); releases the devices it held. `run_started`/`run_ended`: the run's own
        start and end where its scheduler knows them (SLURM), for the table's `on_ended`."""
        if status not in TERMINAL:
            raise ValueError(f"mark_finished needs a terminal status, not {status}")
        values: dict[str, Any] = {
            "finished_at": utcnow(),
            "error_code": error_code,
            # The message may quote the run's output, which may print a secret the launch was given.
            "error_message": redact(error_message) if error_message else error_message,
            "exit_code": exit_code,
            "resources": None,
        }
        moved = self.move(session, row_id, sources_of(status), status, **values)
        if moved and self.on_ended is not None:
            self.on_ended(session, row_id, run_started=run_started, run_ended=run_ended)
        return moved

    def hold(self, session: Session, row_id: str, **values: Any) -> bool:
        """queued -> paused: a pause of a row not placed yet, or of a claim that went back to the queue
        before its launch; never placed until resumed."""
        return self.move(session, row_id, [JobStatus.queued], JobStatus.paused, **values)

    def mark_paused(self, session: Session, row_id: str, *, reason: str | None = None, **values: Any) -> bool:
        """starting/running -> paused once the run a pause stopped has ended (or its claim was never
        launched), giving back its claim and launch handle (`values`: what else changes, a job's attempt)."""
        to_pause = [JobStatus.starting, JobStatus.running]
        return self.move(session, row_id, to_pause, JobStatus.paused, reason=reason, **UNCLAIMED, **values)

    def resume(
        self,
        session: Session,
        row_id: str,
        *,
        reason: str | None = None,
        job_id: str | None = None,
        **values: Any,
    ) -> bool:
        """paused -> queued, with the dispatch that wakes the scheduler (about `job_id`; the row's own id by
        default)."""
        if not self.move(session, row_id, [JobStatus.paused], JobStatus.queued, reason=reason, **values):
            return False
        session.add(
            Dispatch(job_id=job_id or row_id, kind=self.queue_dispatch, created_at=utcnow(), attempts=0)
        )
        return True

    def request_cancel(self, session: Session, row_id: str, *, job_id: str | None = None) -> str | None:
        """queued or paused -> cancelled at once (nothing runs); starting/running -> cancelling, with the
        dispatch that wakes the worker (about `job_id`, the job the row belongs to; a job's own id by
        default). Returns the new status, or None when the row was already cancelling or finished (cancel
        is idempotent)."""
        now = utcnow()
        if self.move(
            session,
            row_id,
            [JobStatus.queued],
            JobStatus.cancelled,
            finished_at=now,
            cancel_requested_at=now,
            error_code="cancelled",
            error_message="cancelled before it started",
        ):
            return JobStatus.cancelled
        if self.move(
            session,
            row_id,
            [JobStatus.paused],
            JobStatus.cancelled,
            finished_at=now,
            cancel_requested_at=now,
            error_code="cancelled",
            error_message="cancelled while paused",
        ):
            return JobStatus.cancelled
        to_cancel = [JobStatus.starting, JobStatus.running]
        if self.move(session, row_id, to_cancel, JobStatus.cancelling, cancel_requested_at=now):
            if self.cancel_dispatch is None:
                return JobStatus.cancelling
            dispatch = Dispatch(
                job_id=job_id or row_id, kind=self.cancel_dispatch, created_at=now, attempts=0
            )
            session.add(dispatch)
            return JobStatus.cancelling
        return None
