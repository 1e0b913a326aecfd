"""HTTP routes for a job's exports: parse, call the service, shape the response."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Response

from ftq.contract.schemas import ExportCreate, ExportList, ExportPublic
from ftq.store import outbox
from service.deps import OwnerDep, SessionDep, SettingsDep
from service.exports import service as exports
from service.jobs.router import JobId, JobLogRoute
from service.routes import error, id_in_path, owner_errors

router = APIRouter(prefix="/jobs", tags=["exports"], route_class=JobLogRoute)

ExportId = Annotated[str, id_in_path("Export id, e.g. exp_0123456789abcdef")]

_ERRORS = owner_errors("No such job (or export) for this owner")


@router.post(
    "/{job_id}/exports",
    status_code=202,
    response_model=ExportPublic,
    responses={
        200: {"model": ExportPublic, "description": "An identical export is under way or done: that one"},
        400: {"description": "A body that does not parse"},
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


@router.get("/{job_id}/exports", response_model=ExportList, responses=_ERRORS, summary="List a job's exports")
def list_exports(job_id: JobId, session: SessionDep, owner: OwnerDep) -> ExportList:
    return ExportList(data=exports.list_exports(session, owner, job_id))


@router.get(
    "/{job_id}/exports/{export_id}", response_model=ExportPublic, responses=_ERRORS, summary="One export"
)
def get_export(job_id: JobId, export_id: ExportId, session: SessionDep, owner: OwnerDep) -> ExportPublic:
    return exports.with_queue(session, owner, [exports.get_or_404(session, owner, job_id, export_id)])[0]


@router.post(
    "/{job_id}/exports/{export_id}/cancel",
    status_code=202,
    response_model=ExportPublic,
    responses=_ERRORS,
    summary="Cancel an export; idempotent, and a finished export is returned unchanged",
)
def cancel_export(
    job_id: JobId, export_id: ExportId, session: SessionDep, owner: OwnerDep, background: BackgroundTasks
) -> ExportPublic:
    export = exports.cancel(session, owner, job_id, export_id)
    background.add_task(outbox.send_for_job, export.job_id)
    return exports.to_public(export)
