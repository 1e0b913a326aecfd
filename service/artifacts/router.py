"""HTTP routes for a job's artifacts: parse, call the service, shape the response."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Header, Path, Request, Response
from fastapi.responses import StreamingResponse

from ftq.contract.schemas import ArtifactList
from ftq.runtime.settings import Settings, get_settings
from ftq.store.db import read_session
from ftq.store.models import Job
from ftq.store.repository import JobRepository
from service.artifacts import service as artifacts
from service.deps import current_owner
from service.jobs.router import JobId, JobLogRoute
from service.jobs.service import get_or_404
from service.routes import ClosingStream, owner_errors

router = APIRouter(prefix="/jobs", tags=["artifacts"], route_class=JobLogRoute)

_ERRORS = owner_errors("No such job for this owner, or no such artifact")

# What a downloaded file may never do in a browser: run as a page of this origin (the dashboard's token
# is in its session storage). Every artifact is an attachment of an opaque type.
_DOWNLOAD_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "Cache-Control": "private, no-cache",
}


async def _job(request: Request, job_id: str) -> Job:
    owner = current_owner(request, get_settings())

    def load() -> Job:
        with read_session() as session:
            job = get_or_404(JobRepository(session, owner), job_id)
            session.expunge(job)
            return job

    return await anyio.to_thread.run_sync(load)


@router.get(
    "/{job_id}/artifacts",
    response_model=ArtifactList,
    responses=_ERRORS,
    summary="Files of the run a user may download",
    description="Every file of `final/`, each checkpoint, each export, and the run's logs (`train.log`, "
    "`metrics.jsonl`, `samples.jsonl`) with its size, kind and sha256. The run's own records (spec, "
    "launch script, exit status, locks) are not artifacts. Symlinks are never listed or followed.",
)
async def list_artifacts(request: Request, job_id: JobId) -> ArtifactList:
    job = await _job(request, job_id)
    settings = get_settings()
    return await anyio.to_thread.run_sync(artifacts.list_artifacts, job, settings)


@router.head(
    "/{job_id}/artifacts/{path:path}",
    responses={**_ERRORS, 200: {"description": "The headers GET would send (size, ETag, type), no body"}},
    summary="An artifact's or a folder tar's headers, without its bytes",
)
@router.get(
    "/{job_id}/artifacts/{path:path}",
    responses={
        **_ERRORS,
        200: {
            "content": {"application/octet-stream": {}, "application/x-tar": {}},
            "description": "The file's bytes (`ETag`, `Last-Modified`, `Accept-Ranges: bytes`), or, for a "
            "path ending in `.tar` that names a folder (`final.tar`, `checkpoints/checkpoint-20.tar`, "
            "`exports/<export id>.tar`), the folder as a tar (streamed, no Range) holding its files "
            "under the folder's name",
        },
        206: {
            "description": "One `Range: bytes=a-b` of the file (`Content-Range`); several ranges are "
            "answered with the whole file (200)"
        },
        304: {"description": "`If-None-Match` holds the file's ETag"},
        416: {"description": "The range starts past the end (`Content-Range: bytes */<size>`)"},
    },
    response_class=StreamingResponse,
    summary="Download one artifact, or a folder as a tar",
    description="Paths are those of `GET /jobs/{id}/artifacts`. `..`, absolute paths, symlinks and the "
    "run's own records are a 404. `If-Range` (an ETag or the Last-Modified date) makes a Range apply only "
    "to the version of the file the client has. train.log comes with the operator's secrets masked "
    "(same size).",
)
async def get_artifact(
    request: Request,
    job_id: JobId,
    path: Annotated[
        str,
        Path(
            description="An artifact's path from the list (`final/adapter_model.safetensors`), or a "
            "folder's path plus `.tar` (`final.tar`, `checkpoints/checkpoint-20.tar`, `exports/<id>.tar`)"
        ),
    ],
    range_: Annotated[
        str | None,
        Header(alias="Range", description="One range: `bytes=a-b`, `bytes=a-` or `bytes=-n` (the last n)"),
    ] = None,
    if_none_match: Annotated[
        str | None, Header(alias="If-None-Match", description="ETags the client has: a match is a 304")
    ] = None,
    if_range: Annotated[
        str | None,
        Header(
            alias="If-Range",
            description="The ETag (or Last-Modified date) of the version the client holds part of: the "
            "Range applies only if the file is still that version, else the whole file comes (200)",
        ),
    ] = None,
) -> Response:
    job = await _job(request, job_id)
    settings = get_settings()
    opened = await anyio.to_thread.run_sync(artifacts.open_file, job, path, settings)
    if opened is None:
        return await _tar(job, path, settings, head=request.method == "HEAD")
    try:
        headers = {
            **_DOWNLOAD_HEADERS,
            "ETag": opened.etag,
            "Last-Modified": opened.last_modified,
            "Accept-Ranges": "bytes",
            "Content-Disposition": artifacts.content_disposition(opened.name),
        }
        if artifacts.etag_matches(if_none_match, opened.etag):
            artifacts.close_file(opened)
            return Response(status_code=304, headers={k: headers[k] for k in ("ETag", "Last-Modified")})
        span = None
        if artifacts.if_range_holds(if_range, opened.etag, opened.last_modified):
            try:
                span = artifacts.parse_range(range_, opened.size)
            except artifacts.Unsatisfiable:
                artifacts.close_file(opened)
                return Response(
                    status_code=416, headers={**headers, "Content-Range": f"bytes */{opened.size}"}
                )
        start, end = span if span is not None else (0, opened.size - 1)
        headers["Content-Length"] = str(end + 1 - start)
        status = 200
        if span is not None:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{opened.size}"
        if request.method == "HEAD":
            artifacts.close_file(opened)
            return _headers_only(status, "application/octet-stream", headers)
        return ClosingStream(
            artifacts.file_chunks(opened, start, end),
            lambda: artifacts.close_file(opened),
            status_code=status,
            media_type="application/octet-stream",
            headers=headers,
        )
    except BaseException:
        artifacts.close_file(opened)
        raise


def _headers_only(status: int, media_type: str, headers: dict[str, str]) -> Response:
    """HEAD's answer: GET's status and headers (Content-Length the body GET would have), no body."""
    return Response(status_code=status, media_type=media_type, headers=headers)


async def _tar(job: Job, path: str, settings: Settings, *, head: bool = False) -> Response:
    folder = artifacts.tar_folder_of(path)
    plan = None
    if folder is not None:
        plan = await anyio.to_thread.run_sync(artifacts.plan_tar, job, folder, settings)
    if plan is None:
        raise artifacts.not_found(job.id, path)
    headers = {
        **_DOWNLOAD_HEADERS,
        "Content-Length": str(plan.size),
        "Accept-Ranges": "none",
        "Content-Disposition": artifacts.content_disposition(plan.name),
    }
    if head:
        return _headers_only(200, "application/x-tar", headers)
    return StreamingResponse(
        artifacts.tar_chunks(job.id, plan, settings), media_type="application/x-tar", headers=headers
    )
