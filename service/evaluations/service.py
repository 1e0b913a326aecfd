"""The rules of evaluations: what may be evaluated (a saved checkpoint, the best one, or a succeeded
job's final/) with which suites (the spec's), cancel as a job's, and the shape of one in responses."""

from __future__ import annotations

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.evaluation import BEST, FINAL, ref_label
from ftq.contract.schemas import EvaluationCreate, EvaluationPublic
from ftq.contract.status import JobStatus
from ftq.runtime.settings import Settings
from ftq.store import evaluations as store
from ftq.store.evaluations import EvaluationRepository
from ftq.store.models import Evaluation, EvaluationQueue, Job
from service import side_runs
from service.errors import Conflict, spec_field_error


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
) -> tuple[Evaluation, bool]:
    """The new evaluation (queued, with its dispatch); never an existing one (False)."""
    job = side_runs.job_or_404(session, owner, job_id)
    suites = [s.get("name") for s in ((job.spec or {}).get("eval") or {}).get("suites") or []]
    if not suites:
        raise Conflict(f"job {job_id} has no eval.suites in its spec: there is nothing to evaluate with")
    for i, name in enumerate(body.suites or []):
        if name in (body.suites or [])[:i]:
            raise spec_field_error(["suites", i], f"suite {name!r} is named twice; name each suite once")
        if name not in suites:
            raise spec_field_error(
                ["suites", i], f"the job's spec has no suite {name!r} (it has {', '.join(suites)})"
            )
    step = resolve_step(session, job, settings, body.checkpoint)
    repo = EvaluationRepository(session, owner)
    side_runs.check_queue_cap(repo, repo.queued_requests(), settings.max_queued_evaluations_per_owner)
    ev = repo.add(
        job.id, step=step, suites=list(body.suites) if body.suites else None, trigger=store.TRIGGER_REQUEST
    )
    session.commit()
    return ev, False


def to_public(ev: Evaluation, queue: EvaluationQueue | None = None) -> EvaluationPublic:
    return EvaluationPublic(
        **side_runs.public_fields(ev, queue),
        checkpoint=ref_label(ev.step),
        results=ev.metrics if ev.status == JobStatus.succeeded else None,
        suites=ev.suites,
        trigger=ev.trigger,
    )


# Read and cancelled as every side run is.
RULES: side_runs.SideRuns[Evaluation, EvaluationPublic] = side_runs.SideRuns(EvaluationRepository, to_public)
