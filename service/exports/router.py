"""HTTP routes for a job's exports: parse, call the service, shape the response."""

from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks, Response

from ftq.contract.schemas import ExportCreate, ExportList, ExportPublic
from ftq.store import outbox
from service.deps import OwnerDep, SessionDep, SettingsDep
from service.exports import service as exports
from service.jobs.router import JobId, JobLogRoute
from service.routes import error, owner_errors
from service.side_run_routes import add_side_run_routes

router = APIRouter(prefix="/jobs", tags=["exports"], route_class=JobLogRoute)

_ERRORS = owner_errors("No such job (or export) for this owner")


@router.post(
    "/{job_id}/exports",
    status_code=202,
    response_model=ExportPublic,
    responses={
        200: {"model": ExportPublic, "description": "An identical export is under way or done: that one"},
        409: error("The job has not succeeded, or `adapter` was asked of a full fine-tune"),
        422: {"description": "A bad field (kind, dtype, max_shard_size, push_to_hub), named in the error"},
        **_ERRORS,
    },
    summary="Export a succeeded job's model (merged weights or the adapter)",
)
def create_export(
    job_id: JobId,
    body: ExportCreate,
    response: Response,
    background: BackgroundTasks,
    session: SessionDep,
    owner: OwnerDep,
    settings: SettingsDep,
) -> ExportPublic:
    export, existing = exports.create(session, owner, settings, job_id, body)
    if existing:
        response.status_code = 200
    else:
        background.add_task(outbox.send_for_job, export.job_id)
    response.headers["Location"] = f"/jobs/{export.job_id}/exports/{export.id}"
    return exports.to_public(export)


add_side_run_routes(
    router,
    exports.RULES,
    noun="export",
    plural="exports",
    id_description="Export id, e.g. exp_0123456789abcdef",
    public=ExportPublic,
    listing=ExportList,
    errors=_ERRORS,
    list_summary="List a job's exports",
    cancel_summary="Cancel an export; idempotent, and a finished export is returned unchanged",
)
