"""HTTP routes for a job's evaluations: parse, call the service, shape the response."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Response

from ftq.contract.schemas import EvaluationCreate, EvaluationList, EvaluationPublic
from ftq.store import outbox
from service.deps import OwnerDep, SessionDep, SettingsDep
from service.evaluations import service as evaluations
from service.jobs.router import JobId, JobLogRoute
from service.routes import error, id_in_path, owner_errors

router = APIRouter(prefix="/jobs", tags=["evaluations"], route_class=JobLogRoute)

EvaluationId = Annotated[str, id_in_path("Evaluation id, e.g. eval_0123456789abcdef")]

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


@router.get(
    "/{job_id}/evaluations",
    response_model=EvaluationList,
    responses=_ERRORS,
    summary="List a job's evaluations, newest first",
)
def list_evaluations(job_id: JobId, session: SessionDep, owner: OwnerDep) -> EvaluationList:
    return EvaluationList(data=evaluations.list_evaluations(session, owner, job_id))


@router.get(
    "/{job_id}/evaluations/{evaluation_id}",
    response_model=EvaluationPublic,
    responses=_ERRORS,
    summary="One evaluation",
)
def get_evaluation(
    job_id: JobId, evaluation_id: EvaluationId, session: SessionDep, owner: OwnerDep
) -> EvaluationPublic:
    ev = evaluations.get_or_404(session, owner, job_id, evaluation_id)
    return evaluations.with_queue(session, owner, [ev])[0]


@router.post(
    "/{job_id}/evaluations/{evaluation_id}/cancel",
    status_code=202,
    response_model=EvaluationPublic,
    responses=_ERRORS,
    summary="Cancel an evaluation; idempotent, and a finished one is returned unchanged",
)
def cancel_evaluation(
    job_id: JobId,
    evaluation_id: EvaluationId,
    session: SessionDep,
    owner: OwnerDep,
    background: BackgroundTasks,
) -> EvaluationPublic:
    ev = evaluations.cancel(session, owner, job_id, evaluation_id)
    background.add_task(outbox.send_for_job, ev.job_id)
    return evaluations.to_public(ev)
