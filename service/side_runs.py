"""The rules every kind of side run shares in the API (an export, an evaluation: a run of a job's that is
not its training): the owner's job or row or a 404, the cap on how many an owner may queue (429), cancel
as a job's, and the parts of its response that are a run's (its error, its place in the queue)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

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


def get_or_404(repo: SideRunRepository[Row, Any], job_id: str, row_id: str) -> Row:
    row = repo.get(job_id, row_id)
    if row is None:
        raise NotFound(f"{repo.noun} {row_id} of job {job_id} not found")
    return row


def with_queue(
    repo: SideRunRepository[Row, Any], rows: list[Row], to_public: Callable[[Row, Any], Public]
) -> list[Public]:
    """The API's rows, each queued one with the scheduler's row for it."""
    queue = repo.queue_of([r.id for r in rows if r.status == JobStatus.queued])
    return [to_public(r, queue.get(r.id)) for r in rows]


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


def cancel(session: Session, repo: SideRunRepository[Row, Any], job_id: str, row_id: str) -> Row:
    """As a job's cancel: queued -> cancelled; starting/running -> cancelling; else nothing changes."""
    row = get_or_404(repo, job_id, row_id)
    changed = repo.request_cancel(row)
    session.commit()
    if changed is not None:
        session.refresh(row)
    return row


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
