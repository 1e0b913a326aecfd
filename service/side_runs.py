"""The rules every kind of side run shares in the API (an export, an evaluation: a run of a job's that is
not its training): the owner's job or row or a 404, the cap on how many an owner may queue (429), cancel
as a job's, and the parts of its response that are a run's (its error, its place in the queue)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from sqlalchemy.orm import Session

from ftq.contract.errors import ErrorCode
from ftq.contract.schemas import JobError, QueueInfo
from ftq.contract.status import JobStatus
from ftq.runtime.redact import redact
from ftq.store.models import Evaluation, EvaluationQueue, Export, ExportQueue, Job
from ftq.store.repository import JobRepository
from ftq.store.side_runs import SideRunRepository
from service.errors import NotFound, QuotaExceeded

Row = TypeVar("Row", Export, Evaluation)
Public = TypeVar("Public")


def job_or_404(session: Session, owner: str, job_id: str) -> Job:
    job = JobRepository(session, owner).get(job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


class SideRuns(Generic[Row, Public]):
    """One kind of side run as the API reads and cancels it: its owner-scoped repository (`repository`)
    and its response (`to_public`, with the scheduler's row while it is queued)."""

    def __init__(
        self,
        repository: type[SideRunRepository[Row, Any]],
        to_public: Callable[[Row, Any], Public],
    ):
        self.noun = repository.noun
        self.repository: type[SideRunRepository[Row, Any]] = repository
        self.to_public: Callable[[Row, Any], Public] = to_public

    def get_or_404(self, session: Session, owner: str, job_id: str, row_id: str) -> Row:
        repo = self.repository(session, owner)
        row: Row | None = repo.get(job_id, row_id)
        if row is None:
            raise NotFound(f"{repo.noun} {row_id} of job {job_id} not found")
        return row

    def list_for(self, session: Session, owner: str, job_id: str) -> list[Public]:
        """The job's runs of this kind, newest first (a 404 for another owner's job)."""
        job_or_404(session, owner, job_id)
        return self.with_queue(session, owner, self.repository(session, owner).list_for(job_id))

    def with_queue(self, session: Session, owner: str, rows: list[Row]) -> list[Public]:
        """The API's rows, each queued one with the scheduler's row for it."""
        repo = self.repository(session, owner)
        queue = repo.queue_of([r.id for r in rows if r.status == JobStatus.queued])
        return [self.to_public(r, queue.get(r.id)) for r in rows]

    def cancel(self, session: Session, owner: str, job_id: str, row_id: str) -> Row:
        """As a job's cancel: queued -> cancelled; starting/running -> cancelling; else nothing changes."""
        row = self.get_or_404(session, owner, job_id, row_id)
        changed = self.repository(session, owner).request_cancel(row)
        session.commit()
        if changed is not None:
            session.refresh(row)
        return row


def check_queue_cap(repo: SideRunRepository[Row, Any], waiting: int, cap: int) -> None:
    """A 429 when `waiting` of the owner's runs of this kind already wait for a device, the most one owner
    may queue (`FTQ_MAX_QUEUED_<NOUN>S_PER_OWNER`, `cap`)."""
    if waiting >= cap:
        noun = repo.noun
        raise QuotaExceeded(
            f"you have {waiting} {noun}s waiting for a device, the most one owner may queue "
            f"(FTQ_MAX_QUEUED_{noun.upper()}S_PER_OWNER={cap}); wait for some to start, or cancel one "
            f"(POST /jobs/{{id}}/{noun}s/{{eid}}/cancel)",
            retry_after=30,
        )


def error_of(row: Export | Evaluation) -> JobError | None:
    """A run's error as the API shows it: none for a cancel (what the user asked for, not a failure)."""
    if not row.error_code or row.status == JobStatus.cancelled:
        return None
    return JobError(
        code=ErrorCode(row.error_code), message=redact(row.error_message or ""), exit_code=row.exit_code
    )


def queue_info(row: Export | Evaluation, queue: ExportQueue | EvaluationQueue | None) -> QueueInfo | None:
    """The scheduler's row for a run while it is queued."""
    if queue is None or row.status != JobStatus.queued:
        return None
    return QueueInfo(position=queue.position, reason=queue.reason, estimated_start=queue.estimated_start)


def public_fields(row: Export | Evaluation, queue: ExportQueue | EvaluationQueue | None) -> dict[str, Any]:
    """What the API's answer about any side run holds: its ids, status, error, times and place in the
    queue."""
    return {
        "id": row.id,
        "job_id": row.job_id,
        "status": JobStatus(row.status),
        "error": error_of(row),
        "created_at": row.created_at,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
        "queue": queue_info(row, queue),
    }
