"""The rules of the jobs API: validate a spec, plan it (`service.jobs.planning`), create a job (with its
idempotency key and outbox record), cancel it, and shape it for responses. Planning, logs, checkpoints
and the metrics poll have modules of their own beside this one."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.errors import ErrorCode
from ftq.contract.evaluation import Best
from ftq.contract.graders import clean_loc
from ftq.contract.metrics import Point
from ftq.contract.plans import Plan
from ftq.contract.schemas import (
    BestCheckpoint,
    EstimateVsActual,
    JobError,
    JobPublic,
    PlanPublic,
    Progress,
    QueueInfo,
    Usage,
)
from ftq.contract.spec import JobSpec, SpecFieldError
from ftq.contract.status import TERMINAL, JobStatus
from ftq.runtime import limits
from ftq.runtime.lru import LRU
from ftq.runtime.redact import redact
from ftq.runtime.settings import Settings, get_settings
from ftq.store import repository
from ftq.store.models import Job, JobQueue
from ftq.store.repository import JobRepository, utcnow
from service.errors import (
    Conflict,
    NotFound,
    NotPausable,
    NotResumable,
    SpecError,
    TooManyRequests,
    spec_field_error,
    suggest_fields,
)
from service.jobs import phase, planning, trackers


def parse_spec(body: Any) -> JobSpec:
    if not isinstance(body, dict):
        raise spec_field_error([], "the body must be a JSON or YAML object (a job spec)", "type_error")
    try:
        return JobSpec.model_validate(body)
    except ValidationError as exc:
        raise SpecError(_errors_from(exc)) from None


def _errors_from(exc: ValidationError) -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = []
    for err in exc.errors(include_url=False):
        loc = list(err.get("loc", ()))
        msg = err.get("msg", "invalid")
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, SpecFieldError):
            # Cross-field rules name the field they are about; pydantic alone would point at the model.
            loc = [*loc, *cause.loc]
            msg = cause.message
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        # A grader's union branch (`string_check`) is no part of the field's path.
        loc = clean_loc(["body", *loc])
        errors.append({"loc": loc, "msg": msg, "type": err.get("type", "value_error")})
    return suggest_fields(errors, JobSpec)


def new_job_id() -> str:
    return "job_" + secrets.token_hex(8)


def request_hash(body: Any) -> str:
    """The digest an Idempotency-Key is stored with: of the request as sent (the parsed body), never of
    what planning makes of it, so a replay is told from a different request before anything is planned."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# Create -----------------------------------------------------------------------------------------------


def plan_for(body: Any, repo: JobRepository, settings: Settings, *, job_id: str) -> tuple[JobSpec, Plan]:
    """The resolved spec and plan of a job to create, or a 422 with every reason it would not run."""
    planned = planning.plan_submission(parse_spec(body), repo, settings, job_id=job_id)
    if planned.refusals:
        raise SpecError(planned.refusals)
    return planned.spec, planned.plan


def dry_run(body: Any, repo: JobRepository, settings: Settings) -> PlanPublic:
    # A dry run always answers with the plan, fits or not, so the user can see why.
    planned = planning.plan_submission(parse_spec(body), repo, settings, job_id="dry-run")
    # Not a green plan for a job that submit would refuse: the same reasons, on the plan.
    planned.plan.warnings = planned.warnings
    return planned.plan


def find_replay(session: Session, repo: JobRepository, key: str, digest: str) -> Job | None:
    """The job an earlier request with this Idempotency-Key made, for a retry to be answered with before
    any rate limit, planning or cap (a client retrying after a lost response gets its job even at the
    cap, or after its dataset changed); None when the key is new (or expired). A different request with
    the key is a 422 `idempotency_mismatch`, decided from `digest` (`request_hash` of the request as
    sent); a request still being processed with it is a 409."""
    existing = repo.get_idempotency(key)
    if existing is None or _expired(existing.expires_at):
        session.rollback()  # the read's transaction ends here: creating the job starts its own
        return None
    return _replayed(repo, existing.request_hash, existing.job_id, digest)


def _expired(expires_at: datetime) -> bool:
    return expires_at.replace(tzinfo=expires_at.tzinfo or UTC) < utcnow()


def _replayed(repo: JobRepository, stored_digest: str, job_id: str | None, digest: str) -> Job:
    if stored_digest != digest:
        raise SpecError(
            [
                {
                    "loc": ["header", "Idempotency-Key"],
                    "msg": "this Idempotency-Key was used with a different request body; use a new key "
                    "for a different request",
                    "type": "idempotency_mismatch",
                }
            ]
        )
    if job_id is None:
        raise Conflict("a request with this Idempotency-Key is still being processed; retry shortly")
    job = repo.get(job_id)
    if job is None:
        raise NotFound("the job created with this Idempotency-Key no longer exists")
    return job


def create_job(
    session: Session,
    repo: JobRepository,
    settings: Settings,
    body: Any,
    idempotency_key: str | None,
    with_job: Callable[[Job], None] | None = None,
    digest: str | None = None,
) -> tuple[Job, bool]:
    """Returns (job, replayed). The job row and its dispatch record commit together, with what
    `with_job` adds for the new job (the `/v1` API's own row). `digest`: what the Idempotency-Key is
    stored with (default: `request_hash(body)`; the `/v1` API's is of its own request). The routes look
    for a replay first (`find_replay`); the claim here settles a race with a concurrent duplicate."""
    job_id = new_job_id()
    spec, plan = plan_for(body, repo, settings, job_id=job_id)

    if repo.count_active() >= settings.max_active_jobs_per_owner:
        raise TooManyRequests(
            f"{repo.owner} already has {settings.max_active_jobs_per_owner} jobs queued or running; "
            "wait for some to finish",
            retry_after=30,
        )

    digest = digest if digest is not None else request_hash(body)
    if idempotency_key is not None:
        replay = _claim_idempotency(session, repo, idempotency_key, digest, settings)
        if replay is not None:
            return replay, True

    now = utcnow()
    job = Job(
        id=job_id,
        name=spec.display_name[:64],
        owner=repo.owner,
        status=JobStatus.queued,
        spec=spec.model_dump(mode="json"),
        plan=plan.model_dump(mode="json"),
        launcher=spec.resources.launcher,
        device=spec.resources.device,
        created_at=now,
        updated_at=now,
        attempt=0,
        metrics_offset=0,
        progress_max_steps=spec.training.max_steps,
        priority=spec.priority,
        devices=spec.resources.world_size,
        limit_seconds=_limit_seconds(spec),
        estimated_seconds=plan.time_estimate.seconds if plan.time_estimate else None,
    )
    try:
        repo.add_with_dispatch(job)
        if with_job is not None:
            with_job(job)
        if idempotency_key is not None:
            row = repo.get_idempotency(idempotency_key)
            if row is None:  # reserved and committed above; only a purge racing this request drops it
                raise Conflict("the Idempotency-Key expired while the job was created; retry")
            row.job_id = job.id
        session.commit()
    except BaseException:
        session.rollback()
        if idempotency_key is not None:
            repo.drop_idempotency(idempotency_key)
            session.commit()
        raise
    return job, False


def _limit_seconds(spec: JobSpec) -> float | None:
    """The job's own time limit: resources.max_seconds locally, slurm.time_limit on SLURM."""
    res = spec.resources
    if res.launcher == "local":
        return float(res.max_seconds) if res.max_seconds else None
    return float(limits.slurm_time_seconds(res.slurm.time_limit)) if res.slurm.time_limit else None


def _claim_idempotency(
    session: Session, repo: JobRepository, key: str, digest: str, settings: Settings
) -> Job | None:
    """Reserve the key (committed at once, so a concurrent duplicate sees it) or return the first job."""
    for _ in range(2):
        existing = repo.get_idempotency(key)
        if existing is not None and _expired(existing.expires_at):
            repo.drop_idempotency(key)
            session.commit()
            existing = None
        if existing is not None:
            return _replayed(repo, existing.request_hash, existing.job_id, digest)
        try:
            repo.reserve_idempotency(key, digest, timedelta(hours=settings.idempotency_ttl_hours))
            session.commit()
            return None
        except IntegrityError:
            session.rollback()
    raise Conflict("a request with this Idempotency-Key is still being processed; retry shortly")


# Reads ------------------------------------------------------------------------------------------------


class _SpecCache:
    """Validated specs by job id. A job's spec never changes after it is stored, and validating it again
    for every job of every list poll would be a large share of what `GET /jobs` costs."""

    def __init__(self, size: int = 4096):
        self._specs: LRU[str, JobSpec] = LRU(size)

    def get(self, job: Job) -> JobSpec:
        spec = self._specs.get(job.id)
        if spec is None:
            spec = JobSpec.model_validate(job.spec)
            self._specs.put(job.id, spec)
        return spec


_spec_cache = _SpecCache()


def to_public(
    job: Job, runs_dir: Path | None = None, queue: JobQueue | None = None, best: Best | None = None
) -> JobPublic:
    """The API's Job; with `runs_dir`, a job before its first step says what it is doing (from its log);
    `queue`: the scheduler's row for it (`JobRepository.queue_of`); `best`: its best checkpoint
    (`ftq.store.evaluations.best_of_jobs`)."""
    error = None
    # A cancel is what the user asked for, not a failure: no error (nor the exit code of the killed run).
    if job.error_code and job.status != JobStatus.cancelled:
        # Stored redacted; masked again in case the secret was set after the job ended.
        message = redact(job.error_message or "")
        error = JobError(code=ErrorCode(job.error_code), message=message, exit_code=job.exit_code)
    spec = _spec_cache.get(job)
    now = phase.phase_of(job, spec.resources.world_size, runs_dir)
    return JobPublic(
        id=job.id,
        name=job.name,
        owner=job.owner,
        status=JobStatus(job.status),
        spec=spec,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        launcher=job.launcher,
        external_id=job.external_id,
        progress=Progress(
            step=job.progress_step,
            max_steps=job.progress_max_steps,
            epoch=job.progress_epoch,
            eta_seconds=job.eta_seconds,
            phase=now.phase,
            message=now.message,
        ),
        latest_metrics=Point.model_validate(job.latest_metrics) if job.latest_metrics else None,
        error=error,
        trackers=trackers.tracker_runs(job, spec, runs_dir),
        queue=_queue_info(job, queue),
        usage=_usage(job, spec),
        estimate_vs_actual=_estimate_vs_actual(job),
        best_checkpoint=BestCheckpoint(step=best.step, metric=best.metric, value=best.value)
        if best
        else None,
    )


def _queue_info(job: Job, row: JobQueue | None) -> QueueInfo | None:
    if row is None or job.status in TERMINAL:
        return None
    # A local job's row is the scheduler's until the job starts (the next tick drops it); SLURM's pending
    # reason stays while SLURM holds the job.
    if row.position is not None and job.status != JobStatus.queued:
        return None
    return QueueInfo(position=row.position, reason=row.reason, estimated_start=row.estimated_start)


def _usage(job: Job, spec: JobSpec) -> Usage | None:
    if job.device_seconds is None:
        return None
    return Usage(
        devices=job.devices or spec.resources.world_size,
        device_seconds=round(job.device_seconds, 3),
        gpu_hours=round(job.device_seconds / 3600, 6) if job.device == "cuda" else 0.0,
    )


def _estimate_vs_actual(job: Job) -> EstimateVsActual | None:
    if job.status != JobStatus.succeeded or job.run_seconds is None:
        return None
    est = job.estimated_seconds
    return EstimateVsActual(
        estimated_seconds=est,
        actual_seconds=round(job.run_seconds, 3),
        ratio=round(job.run_seconds / est, 4) if est else None,
    )


def get_or_404(repo: JobRepository, job_id: str) -> Job:
    job = repo.get(job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def cancel(session: Session, repo: JobRepository, job_id: str) -> Job:
    job = get_or_404(repo, job_id)
    new_status = repository.request_cancel(session, job.id)
    session.commit()
    if new_status is not None:
        session.refresh(job)
    return job


def pause_job(session: Session, repo: JobRepository, job_id: str) -> Job:
    """Hold a queued job at once; ask a starting or running one to stop with a checkpoint (the worker then
    records it `paused` and frees its devices). Idempotent: a paused or pausing job is returned as it is.
    404 for another owner's job; 409 `not_pausable` once it has ended or is being cancelled."""
    job = get_or_404(repo, job_id)
    if repository.request_pause(session, job.id) is not None:
        session.commit()
        session.refresh(job)
        return job
    session.rollback()
    session.refresh(job)
    if job.status == JobStatus.paused or (job.status in repository.PAUSABLE and job.pause_requested_at):
        return job
    raise NotPausable(f"job {job.id} is {job.status}: only a queued, starting or running job can be paused")


def resume_job(session: Session, repo: JobRepository, job_id: str) -> Job:
    """Queue a paused job again; its next run continues from its newest checkpoint at that step.
    Idempotent: a job queued or running (not pausing) is returned as it is. 404 for another owner's job;
    409 `not_resumable` while a pause is still stopping its run, or once it has ended."""
    job = get_or_404(repo, job_id)
    ckpt = runs.latest_checkpoint(runs.run_dir(get_settings().runs_dir, job.id))
    if repository.resume(session, job.id, checkpoint=ckpt.step if ckpt is not None else None):
        session.commit()
        session.refresh(job)
        return job
    session.rollback()
    session.refresh(job)
    if job.status in repository.PAUSABLE and job.pause_requested_at is not None:
        raise NotResumable(
            f"job {job.id} is still pausing (its run is saving a checkpoint); resume it once paused"
        )
    if job.status in (JobStatus.queued, *repository.PAUSABLE):
        return job
    raise NotResumable(f"job {job.id} is {job.status}: only a paused job can be resumed")
