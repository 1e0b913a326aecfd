"""HTTP routes for jobs: parse, call the service, shape the response."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict, deque
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from ftq.contract.schemas import (
    CheckpointList,
    ErrorBody,
    JobList,
    JobPublic,
    LogChunk,
    MetricsPage,
    PlanPublic,
    SamplesPage,
)
from ftq.contract.status import TERMINAL, JobStatus
from ftq.runtime.logs import job_context
from ftq.runtime.settings import get_settings
from ftq.store import outbox
from ftq.store.db import read_session
from ftq.store.evaluations import best_of_jobs
from ftq.store.models import Job
from ftq.store.repository import JobRepository
from service.body import media_type, read_spec_body
from service.deps import LoopOwnerDep, RepoDep, SessionDep, SettingsDep, current_owner
from service.errors import TooManyRequests, parse_cursor, spec_field_error
from service.jobs import checkpoints, log_stream, logs, poll, samples
from service.jobs import service as jobs
from service.jobs.reads import in_thread
from service.routes import CROSS_SITE, error, id_in_path, owner_errors


class JobLogRoute(APIRoute):
    """A route under /jobs/{job_id}: what is logged while it runs (its dependencies, the endpoint, the
    response and its background tasks) carries the job id (ftq.runtime.logs)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        job_id = scope.get("path_params", {}).get("job_id")
        with job_context(job_id if isinstance(job_id, str) else None):
            await super().handle(scope, receive, send)


router = APIRouter(prefix="/jobs", tags=["jobs"], route_class=JobLogRoute)


JobId = Annotated[str, id_in_path("Job id, e.g. job_0123456789abcdef")]

_ERRORS = owner_errors("No such job for this owner")

_SPEC_BODY = {
    "requestBody": {
        "required": True,
        "description": "The job spec, as JSON or YAML.",
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/JobSpec"}},
            "application/yaml": {"schema": {"$ref": "#/components/schemas/JobSpec"}},
        },
    }
}


async def _read_spec_body(request: Request) -> Any:
    # The content type first, so an unsupported body is refused without being read (no type is a 415:
    # a browser's no-cors form post sends none, and must not pass for JSON).
    content_type = request.headers.get("content-type")
    media_type(content_type)
    return await read_spec_body(await request.body(), content_type)


class RateLimiter:
    """Sliding one-minute window per owner for POST /jobs (per API process)."""

    def __init__(self) -> None:
        self._hits: dict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()

    def check(self, owner: str, per_minute: int) -> None:
        now = time.monotonic()
        with self._lock:
            hits = self._hits[owner]
            while hits and now - hits[0] > 60:
                hits.popleft()
            if len(hits) >= per_minute:
                raise TooManyRequests(
                    f"more than {per_minute} job submissions in a minute",
                    retry_after=int(60 - (now - hits[0])) + 1,
                )
            hits.append(now)


@router.post(
    "",
    status_code=201,
    response_model=JobPublic,
    openapi_extra=_SPEC_BODY,
    responses={
        200: {"model": PlanPublic, "description": "dry_run=true: the plan; nothing is stored or launched"},
        400: error("The body is not JSON or YAML"),
        409: error("A request with this Idempotency-Key is in progress"),
        413: error("The body is too large"),
        403: CROSS_SITE,
        415: error("No content type, or not JSON or YAML"),
        429: error("Rate or active-job limit reached"),
        **_ERRORS,
    },
    summary="Submit a job",
)
async def create_job(
    request: Request,
    response: Response,
    background: BackgroundTasks,
    session: SessionDep,
    repo: RepoDep,
    settings: SettingsDep,
    dry_run: bool = Query(False, description="Validate and render the plan only; store nothing."),
    idempotency_key: str | None = Header(
        None,
        alias="Idempotency-Key",
        max_length=255,
        description="Retries with the same key and body return the same job (201 with "
        "`Idempotent-Replayed: true`), answered before the rate limit, planning and the active-jobs cap; "
        "the same key with a different body is a 422 `idempotency_mismatch`.",
    ),
) -> Any:
    spec_body = await _read_spec_body(request)
    if dry_run:
        plan = await asyncio.to_thread(jobs.dry_run, spec_body, repo, settings)
        return Response(content=plan.model_dump_json(), media_type="application/json", status_code=200)
    digest = jobs.request_hash(spec_body)
    if idempotency_key is not None:
        # A retry is answered with its job before anything that could refuse a new one.
        first = await asyncio.to_thread(jobs.find_replay, session, repo, idempotency_key, digest)
        if first is not None:
            return _created(response, first, replayed=True)
    request.app.state.rate_limiter.check(repo.owner, settings.post_rate_per_minute)
    job, replayed = await asyncio.to_thread(
        jobs.create_job, session, repo, settings, spec_body, idempotency_key, None, digest
    )
    if not replayed:
        background.add_task(outbox.send_for_job, job.id)
    return _created(response, job, replayed=replayed)


def _created(response: Response, job: Job, *, replayed: bool) -> JobPublic:
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"/jobs/{job.id}"
    return jobs.to_public(job)


# The read routes polled all the time (job, list, logs, metrics, samples) do all their work in one
# thread-pool hop (service.jobs.reads); their bodies are the bytes the response model would give
# (by_alias, as FastAPI serializes).


def _json(model: BaseModel) -> bytes:
    return model.__pydantic_serializer__.to_json(model, by_alias=True)


_json_response = poll.json_response


@router.get(
    "", response_model=JobList, responses={401: _ERRORS[401], 400: {"model": ErrorBody}}, summary="List jobs"
)
async def list_jobs(
    owner: LoopOwnerDep,
    status: str | None = Query(None, description="Comma-separated statuses, e.g. queued,running"),
    limit: int = Query(50, ge=1, le=500),
    cursor: str | None = Query(None, max_length=32, description="next_cursor of the previous page"),
) -> Response:
    statuses = None
    if status:
        statuses = [s.strip() for s in status.split(",") if s.strip()]
        bad = [s for s in statuses if s not in JobStatus.__members__]
        if bad:
            raise spec_field_error(["status"], f"unknown status {bad[0]!r}; one of {', '.join(JobStatus)}")
    before = parse_cursor(cursor)

    def body() -> bytes:
        with read_session() as session:
            rows = JobRepository(session, owner).list_page(
                statuses=statuses, limit=limit + 1, before_seq=before
            )
            page = rows[:limit]
            next_cursor = str(page[-1].seq) if len(rows) > limit else None
            runs_dir = get_settings().runs_dir
            repo = JobRepository(session, owner)
            waiting = repo.queue_of([j.id for j in page if j.status not in TERMINAL])
            best = best_of_jobs(session, page)
            data = [jobs.to_public(j, runs_dir, waiting.get(j.id), best.get(j.id)) for j in page]
            return _json(JobList(data=data, next_cursor=next_cursor))

    return _json_response(await in_thread(body))


@router.get("/{job_id}", response_model=JobPublic, responses=_ERRORS, summary="Get a job")
async def get_job(job_id: JobId, owner: LoopOwnerDep) -> Response:
    def body() -> bytes:
        with read_session() as session:
            repo = JobRepository(session, owner)
            job = jobs.get_or_404(repo, job_id)
            queue = repo.queue_of([job.id]).get(job.id) if job.status not in TERMINAL else None
            best = best_of_jobs(session, [job]).get(job.id)
            return _json(jobs.to_public(job, get_settings().runs_dir, queue, best))

    return _json_response(await in_thread(body))


@router.post(
    "/{job_id}/cancel", status_code=202, response_model=JobPublic, responses=_ERRORS, summary="Cancel a job"
)
def cancel_job(job_id: JobId, session: SessionDep, repo: RepoDep, background: BackgroundTasks) -> JobPublic:
    job = jobs.cancel(session, repo, job_id)
    background.add_task(outbox.send_for_job, job.id)
    return jobs.to_public(job)


_STATE_ERRORS = {**_ERRORS, 409: error("The job's status does not allow it (`code` says which)")}


@router.post(
    "/{job_id}/pause",
    status_code=202,
    response_model=JobPublic,
    responses=_STATE_ERRORS,
    summary="Pause a job",
    description="A queued job is held at once (`paused`, never placed). A starting or running job's ranks "
    "save a checkpoint at their next step and end; its devices are freed and it shows `paused` (until then "
    "it keeps its status, with `progress.phase` `pausing`). Idempotent. 409 `not_pausable` once the job has "
    "ended or is being cancelled.",
)
def pause_job(job_id: JobId, session: SessionDep, repo: RepoDep) -> JobPublic:
    return jobs.to_public(jobs.pause_job(session, repo, job_id))


@router.post(
    "/{job_id}/resume",
    status_code=202,
    response_model=JobPublic,
    responses=_STATE_ERRORS,
    summary="Resume a paused job",
    description="Queues a paused job again; when placed, it continues from its newest checkpoint at that "
    "step and ends at its planned max steps. Idempotent on a queued or running job. 409 `not_resumable` "
    "while a pause is still stopping the run, or once the job has ended.",
)
def resume_job(job_id: JobId, session: SessionDep, repo: RepoDep, background: BackgroundTasks) -> JobPublic:
    job = jobs.resume_job(session, repo, job_id)
    background.add_task(outbox.send_for_job, job.id)
    return jobs.to_public(job)


@router.get(
    "/{job_id}/plan", response_model=PlanPublic, responses=_ERRORS, summary="What was rendered for a job"
)
def get_plan(job_id: JobId, repo: RepoDep) -> PlanPublic:
    job = jobs.get_or_404(repo, job_id)
    return PlanPublic.model_validate(job.plan or {})


@router.get(
    "/{job_id}/logs", response_model=LogChunk, responses=_ERRORS, summary="Read train.log by byte offset"
)
async def get_logs(
    job_id: JobId,
    owner: LoopOwnerDep,
    offset: int = Query(0, ge=0, le=2**62),
    limit: int = Query(65536, ge=1, le=logs.LOG_CHUNK_MAX),
) -> Response:
    settings = get_settings()

    def body() -> bytes:
        with read_session() as session:
            job = jobs.get_or_404(JobRepository(session, owner), job_id)
        return _json(
            logs.read_log(job, settings, offset=offset, limit=limit, secrets_=settings.secret_values())
        )

    return _json_response(await in_thread(body))


@router.get(
    "/{job_id}/logs/stream",
    responses={
        **_ERRORS,
        200: {
            "content": {"text/event-stream": {}},
            "description": "train.log as server-sent events: `log` events (offset, next_offset, text), "
            "a `: ping` comment every FTQ_LOG_STREAM_HEARTBEAT_SECONDS while nothing is new, and one "
            "`end` event once the job has ended and its log is read",
        },
        429: error("This owner already has FTQ_MAX_LOG_STREAMS_PER_OWNER open"),
    },
    response_class=StreamingResponse,
    summary="Follow train.log until the job ends",
)
async def stream_logs(
    job_id: JobId,
    owner: LoopOwnerDep,
    offset: int = Query(0, ge=0, le=2**62),
) -> Response:
    return await log_stream.follow(owner, job_id, offset, get_settings())


@router.get(
    "/{job_id}/metrics", response_model=MetricsPage, responses=_ERRORS, summary="Metric points after a step"
)
async def get_metrics(
    request: Request,
    job_id: JobId,
    after_step: int = Query(poll.AFTER_STEP_DEFAULT, ge=poll.AFTER_STEP_MIN, le=poll.AFTER_STEP_MAX),
    limit: int = Query(poll.LIMIT_DEFAULT, ge=poll.LIMIT_MIN, le=poll.LIMIT_MAX),
) -> Response:
    # A plain poll is answered by poll.MetricsPollPath before it gets here; this route answers the rest
    # (and its errors), and is the one the OpenAPI document describes.
    owner = current_owner(request, get_settings())  # as LoopOwnerDep, without a dependency to resolve
    return _json_response(
        await poll.poll_body(request.app.state, owner, job_id, after_step=after_step, limit=limit)
    )


@router.get(
    "/{job_id}/checkpoints", response_model=CheckpointList, responses=_ERRORS, summary="Saved checkpoints"
)
def get_checkpoints(job_id: JobId, repo: RepoDep, settings: SettingsDep) -> CheckpointList:
    """Each with what its evaluations scored (`metrics`) and whether it is the best one (`best`)."""
    job = jobs.get_or_404(repo, job_id)
    return CheckpointList(data=checkpoints.scored_checkpoints(repo.session, job, settings))


@router.get(
    "/{job_id}/samples",
    response_model=SamplesPage,
    responses=_ERRORS,
    summary="Completions of the sample prompts, by step",
)
async def get_samples(
    job_id: JobId,
    owner: LoopOwnerDep,
    after_step: int = Query(-1, ge=-1, le=2**31 - 1, description="Only samples of steps after this one."),
    limit: int = Query(
        100, ge=1, le=1000, description="At most this many steps (each with all its prompts)."
    ),
) -> Response:
    """The greedy completions of the spec's `eval.sample_prompts` that the trainer wrote to samples.jsonl:
    at every evaluation (with an eval split), else every `eval_steps` (or `save_steps`) steps, and at the
    end. Poll with `after_step` set to the previous page's `next_after_step`."""

    def body() -> bytes:
        with read_session() as session:
            page = samples.samples_page(
                JobRepository(session, owner), job_id, after_step=after_step, steps=limit
            )
            return _json(page)

    return _json_response(await in_thread(body))
