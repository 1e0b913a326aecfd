"""The OpenAI-compatible API under `/v1`: fine-tuning jobs, their events and checkpoints, models, and
(service.openai.files) files and uploads. Every route answers errors in OpenAI's envelope
(service.openai.errors, applied by the app's handlers to every `/v1` path)."""

from __future__ import annotations

import re
from typing import Annotated

import anyio
from fastapi import APIRouter, BackgroundTasks, Header, Path, Query, Request, Response
from pydantic import BaseModel

from ftq.contract.graders import (
    GraderRunRequest,
    GraderRunResponse,
    GraderValidateRequest,
    GraderValidateResponse,
)
from ftq.contract.openai import (
    FineTuningJob,
    FineTuningJobCheckpoint,
    FineTuningJobEvent,
    JobCreate,
    OpenAIErrorBody,
    OpenAIList,
)
from ftq.runtime.settings import get_settings
from ftq.store import outbox
from ftq.store.db import new_session, read_session
from ftq.store.openai_repository import OpenAIRepository
from service.deps import LoopOwnerDep
from service.graders import service as graders
from service.jobs.poll import json_response
from service.jobs.reads import in_thread
from service.openai import ids
from service.openai import jobs as v1_jobs
from service.openai.errors import not_found
from service.openai.files import router as files_router
from service.openai.pagination import AFTER, LIMIT, listing, page_of

# The routes whose bodies are streamed to disk under caps of their own (service.app.BodySizeLimit).
STREAMED_V1_UPLOADS = re.compile(r"/v1/files/?|/v1/uploads/upload_[0-9a-f]{24}/parts")

_ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": OpenAIErrorBody, "description": what}
    for code, what in (
        (400, "Invalid request; `error.param` names the parameter"),
        (401, "Missing or invalid API key (an ftq token)"),
        (404, "No such object for this owner"),
        (429, "Rate or active-job limit reached"),
    )
}

router = APIRouter(tags=["openai"], responses=_ERRORS)


def _json(model: BaseModel) -> bytes:
    # The polled reads answer with the bytes the response model would give, built once in the read's
    # thread (as the native job and metrics polls do), not validated again by FastAPI.
    return model.__pydantic_serializer__.to_json(model, by_alias=True)


router.include_router(files_router)

FtJobId = Annotated[str, Path(min_length=1, max_length=64, description="ftjob-<hex>")]


@router.post("/v1/fine_tuning/jobs", response_model=FineTuningJob, summary="Create a fine-tuning job")
async def create_job(
    request: Request,
    response: Response,
    background: BackgroundTasks,
    body: JobCreate,
    owner: LoopOwnerDep,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> FineTuningJob:
    settings = get_settings()
    if idempotency_key is not None:
        # A retry gets its job before the rate limit, the files' checks and the active-jobs cap.
        key = idempotency_key

        def find() -> FineTuningJob | None:
            session = new_session()
            try:
                return v1_jobs.replay(session, owner, settings, key, body)
            finally:
                session.close()

        first = await anyio.to_thread.run_sync(find)
        if first is not None:
            response.headers["Idempotent-Replayed"] = "true"
            return first
    request.app.state.rate_limiter.check(owner, settings.post_rate_per_minute)

    def run() -> FineTuningJob:
        session = new_session()
        try:
            return v1_jobs.create(session, owner, settings, body, idempotency_key)
        finally:
            session.close()

    job: FineTuningJob = await anyio.to_thread.run_sync(run)
    background.add_task(outbox.send_for_job, ids.job_in(job.id) or job.id)
    return job


@router.get("/v1/fine_tuning/jobs", response_model=OpenAIList[FineTuningJob], summary="List fine-tuning jobs")
def list_jobs(
    request: Request,
    owner: LoopOwnerDep,
    after: str | None = AFTER,
    limit: int = LIMIT,
) -> OpenAIList[FineTuningJob]:
    # metadata[key]=value, as the SDK sends a `metadata` filter.
    metadata = {
        k[len("metadata[") : -1]: v
        for k, v in request.query_params.items()
        if k.startswith("metadata[") and k.endswith("]")
    }
    settings = get_settings()
    native_after = None
    if after is not None:
        native_after = ids.job_in(after)
        if native_after is None:
            raise not_found(f"No such fine-tuning job: {after}", "after")
    with read_session() as session:
        rows, more = OpenAIRepository(session, owner).page(after=native_after, limit=limit, metadata=metadata)
        data = [v1_jobs.to_openai(job, extra, settings) for job, extra in rows]
    return listing(data, more, lambda j: j.id)


@router.get(
    "/v1/fine_tuning/jobs/{job_id}", response_model=FineTuningJob, summary="Retrieve a fine-tuning job"
)
async def retrieve_job(job_id: FtJobId, owner: LoopOwnerDep) -> Response:
    def body() -> bytes:
        with read_session() as session:
            job, extra = v1_jobs.get_or_404(OpenAIRepository(session, owner), job_id)
            return _json(v1_jobs.to_openai(job, extra, get_settings()))

    return json_response(await in_thread(body))


@router.post(
    "/v1/fine_tuning/jobs/{job_id}/cancel", response_model=FineTuningJob, summary="Cancel a fine-tuning job"
)
def cancel_job(job_id: FtJobId, owner: LoopOwnerDep, background: BackgroundTasks) -> FineTuningJob:
    return _change(job_id, owner, background, "cancel")


def _change(job_id: str, owner: str, background: BackgroundTasks, what: str) -> FineTuningJob:
    settings = get_settings()
    session = new_session()
    try:
        result = v1_jobs.change(session, owner, job_id, settings, what)
    finally:
        session.close()
    background.add_task(outbox.send_for_job, ids.job_in(result.id) or result.id)
    return result


@router.post(
    "/v1/fine_tuning/jobs/{job_id}/pause",
    response_model=FineTuningJob,
    summary="Pause a running fine-tuning job (it checkpoints and frees its devices)",
)
def pause_job(job_id: FtJobId, owner: LoopOwnerDep, background: BackgroundTasks) -> FineTuningJob:
    return _change(job_id, owner, background, "pause")


@router.post(
    "/v1/fine_tuning/jobs/{job_id}/resume",
    response_model=FineTuningJob,
    summary="Resume a paused fine-tuning job from its checkpoint",
)
def resume_job(job_id: FtJobId, owner: LoopOwnerDep, background: BackgroundTasks) -> FineTuningJob:
    return _change(job_id, owner, background, "resume")


@router.get(
    "/v1/fine_tuning/jobs/{job_id}/events",
    response_model=OpenAIList[FineTuningJobEvent],
    summary="A fine-tuning job's events (messages and metrics), newest first",
)
async def list_events(
    job_id: FtJobId, owner: LoopOwnerDep, after: str | None = AFTER, limit: int = LIMIT
) -> Response:
    def body() -> bytes:
        with read_session() as session:
            repo = OpenAIRepository(session, owner)
            job, _ = v1_jobs.get_or_404(repo, job_id)
            return _json(page_of(v1_jobs.events(repo, job), after, limit, lambda e: e.id))

    return json_response(await in_thread(body))


@router.get(
    "/v1/fine_tuning/jobs/{job_id}/checkpoints",
    response_model=OpenAIList[FineTuningJobCheckpoint],
    summary="A fine-tuning job's checkpoints, newest first",
)
def list_checkpoints(
    job_id: FtJobId, owner: LoopOwnerDep, after: str | None = AFTER, limit: int = Query(10, ge=1, le=100)
) -> OpenAIList[FineTuningJobCheckpoint]:
    settings = get_settings()
    with read_session() as session:
        repo = OpenAIRepository(session, owner)
        job, extra = v1_jobs.get_or_404(repo, job_id)
        return page_of(v1_jobs.checkpoints(repo, job, extra, settings), after, limit, lambda c: c.id)


# Models (GET /v1/models) are served by service.serving.router: what a caller may fine-tune and call.


@router.post(
    "/v1/fine_tuning/alpha/graders/run", response_model=GraderRunResponse, summary="Run a grader on a sample"
)
async def run_grader(body: GraderRunRequest, owner: LoopOwnerDep) -> GraderRunResponse:
    return await graders.run(body, get_settings(), owner)


@router.post(
    "/v1/fine_tuning/alpha/graders/validate",
    response_model=GraderValidateResponse,
    summary="Validate a grader",
)
async def validate_grader(body: GraderValidateRequest, owner: LoopOwnerDep) -> GraderValidateResponse:
    graders.check_allowed(body.grader, get_settings())
    return GraderValidateResponse(grader=body.grader)
