"""HTTP routes for a job's evaluations: parse, call the service, shape the response."""

from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks, Response

from ftq.contract.schemas import EvaluationCreate, EvaluationList, EvaluationPublic
from ftq.store import outbox
from service.deps import OwnerDep, SessionDep, SettingsDep
from service.evaluations import service as evaluations
from service.jobs.router import JobId, JobLogRoute
from service.routes import error, owner_errors
from service.side_run_routes import add_side_run_routes

router = APIRouter(prefix="/jobs", tags=["evaluations"], route_class=JobLogRoute)

_ERRORS = owner_errors("No such job (or evaluation) for this owner")


@router.post(
    "/{job_id}/evaluations",
    status_code=202,
    response_model=EvaluationPublic,
    responses={
        409: error("The job has no eval.suites, no final/ yet (final), or no best checkpoint yet (best)"),
        429: error("FTQ_MAX_QUEUED_EVALUATIONS_PER_OWNER of yours already wait for a device"),
        400: {"description": "A body that does not parse"},
        422: {"description": "A bad field (checkpoint, suites), named in the error"},
        **_ERRORS,
    },
    summary="Evaluate a checkpoint (final, best or a step) with the spec's suites",
)
def create_evaluation(
    job_id: JobId,
    body: EvaluationCreate,
    response: Response,
    background: BackgroundTasks,
    session: SessionDep,
    owner: OwnerDep,
    settings: SettingsDep,
) -> EvaluationPublic:
    ev = evaluations.create(session, owner, settings, job_id, body)
    background.add_task(outbox.send_for_job, ev.job_id)
    response.headers["Location"] = f"/jobs/{ev.job_id}/evaluations/{ev.id}"
    return evaluations.to_public(ev)


add_side_run_routes(
    router,
    evaluations.RULES,
    noun="evaluation",
    plural="evaluations",
    id_description="Evaluation id, e.g. eval_0123456789abcdef",
    public=EvaluationPublic,
    listing=EvaluationList,
    errors=_ERRORS,
    list_summary="List a job's evaluations, newest first",
    cancel_summary="Cancel an evaluation; idempotent, and a finished one is returned unchanged",
)
