"""The rules of evaluations: what may be evaluated (a saved checkpoint, the best one, or a succeeded
job's final/) with which suites (the spec's), cancel as a job's, and the shape of one in responses."""

from __future__ import annotations

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.errors import ErrorCode
from ftq.contract.evaluation import BEST, FINAL, ref_label
from ftq.contract.schemas import EvaluationCreate, EvaluationPublic, JobError, QueueInfo
from ftq.contract.status import JobStatus
from ftq.runtime.redact import redact
from ftq.runtime.settings import Settings
from ftq.store import evaluations as store
from ftq.store.evaluations import EvaluationRepository
from ftq.store.models import Evaluation, EvaluationQueue, Job
from ftq.store.repository import JobRepository
from service.errors import Conflict, NotFound, QuotaExceeded, spec_field_error


def job_or_404(session: Session, owner: str, job_id: str) -> Job:
    job = JobRepository(session, owner).get(job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def get_or_404(session: Session, owner: str, job_id: str, evaluation_id: str) -> Evaluation:
    ev = EvaluationRepository(session, owner).get(job_id, evaluation_id)
    if ev is None:
        raise NotFound(f"evaluation {evaluation_id} of job {job_id} not found")
    return ev


def list_evaluations(session: Session, owner: str, job_id: str) -> list[EvaluationPublic]:
    job_or_404(session, owner, job_id)
    return with_queue(session, owner, EvaluationRepository(session, owner).list_for(job_id))


def with_queue(session: Session, owner: str, rows: list[Evaluation]) -> list[EvaluationPublic]:
    queue = EvaluationRepository(session, owner).queue_of(
        [e.id for e in rows if e.status == JobStatus.queued]
    )
    return [to_public(e, queue.get(e.id)) for e in rows]


def resolve_step(session: Session, job: Job, settings: Settings, checkpoint: str | int) -> int | None:
    """The step a request's `checkpoint` names (None: final/), or the 409/422 saying why it cannot be."""
    run_dir = runs.run_dir(settings.runs_dir, job.id)
    if checkpoint == FINAL:
        if job.status != JobStatus.succeeded or not (run_dir / runs.FINAL).is_dir():
            raise Conflict(
                f"job {job.id} is {job.status}: only a succeeded job has a final/ model; name a saved "
                "checkpoint's step instead (GET /jobs/{id}/checkpoints)"
            )
        return None
    if checkpoint == BEST:
        best = store.best_checkpoint(job.spec, store.of_job(session, job.id))
        if best is None:
            raise Conflict(
                f"job {job.id} has no best checkpoint yet: it needs eval.select in its spec and a scored "
                "checkpoint"
            )
        return best.step
    steps = [c.step for c in runs.list_checkpoints(run_dir)]
    if checkpoint not in steps:
        have = ", ".join(str(s) for s in steps) or "none"
        raise spec_field_error(
            ["checkpoint"], f"job {job.id} has no checkpoint at step {checkpoint} (have {have})", "not_found"
        )
    return int(checkpoint)


def create(
    session: Session, owner: str, settings: Settings, job_id: str, body: EvaluationCreate
) -> Evaluation:
    job = job_or_404(session, owner, job_id)
    suites = [s.get("name") for s in ((job.spec or {}).get("eval") or {}).get("suites") or []]
    if not suites:
        raise Conflict(f"job {job_id} has no eval.suites in its spec: there is nothing to evaluate with")
    for i, name in enumerate(body.suites or []):
        if name not in suites:
            raise spec_field_error(
                ["suites", i], f"the job's spec has no suite {name!r} (it has {', '.join(suites)})"
            )
    step = resolve_step(session, job, settings, body.checkpoint)
    repo = EvaluationRepository(session, owner)
    waiting = repo.queued_requests()
    if waiting >= settings.max_queued_evaluations_per_owner:
        raise QuotaExceeded(
            f"you have {waiting} evaluations waiting for a device, the most one owner may queue "
            f"(FTQ_MAX_QUEUED_EVALUATIONS_PER_OWNER={settings.max_queued_evaluations_per_owner}); wait for "
            "some to start, or cancel one (POST /jobs/{id}/evaluations/{eid}/cancel)",
            retry_after=30,
        )
    ev = repo.add(
        job.id, step=step, suites=list(body.suites) if body.suites else None, trigger=store.TRIGGER_REQUEST
    )
    session.commit()
    return ev


def cancel(session: Session, owner: str, job_id: str, evaluation_id: str) -> Evaluation:
    ev = get_or_404(session, owner, job_id, evaluation_id)
    changed = store.request_cancel(session, ev)
    session.commit()
    if changed is not None:
        session.refresh(ev)
    return ev


def to_public(ev: Evaluation, queue: EvaluationQueue | None = None) -> EvaluationPublic:
    error = None
    if ev.error_code and ev.status != JobStatus.cancelled:
        error = JobError(
            code=ErrorCode(ev.error_code), message=redact(ev.error_message or ""), exit_code=ev.exit_code
        )
    return EvaluationPublic(
        id=ev.id,
        job_id=ev.job_id,
        checkpoint=ref_label(ev.step),
        status=JobStatus(ev.status),
        results=ev.metrics if ev.status == JobStatus.succeeded else None,
        error=error,
        suites=ev.suites,
        trigger=ev.trigger,
        created_at=ev.created_at,
        started_at=ev.started_at,
        finished_at=ev.finished_at,
        queue=(
            QueueInfo(position=queue.position, reason=queue.reason, estimated_start=queue.estimated_start)
            if queue is not None and ev.status == JobStatus.queued
            else None
        ),
    )
