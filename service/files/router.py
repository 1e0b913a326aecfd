"""HTTP routes for uploaded files: parse, call the service, shape the response."""

from __future__ import annotations

import errno
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, BackgroundTasks, Query, Request, Response
from fastapi.responses import FileResponse

from ftq.contract.schemas import FileList, FilePublic
from ftq.runtime import files
from ftq.runtime.settings import get_settings
from ftq.store import outbox
from ftq.store.db import read_session
from ftq.store.files_repository import FileRepository
from service.deps import LoopOwnerDep, in_thread_session
from service.errors import (
    InsufficientStorage,
    NotFound,
    UnsupportedMediaType,
    parse_cursor,
)
from service.files import service as file_service
from service.files import upload
from service.routes import CROSS_SITE, UNAUTHORIZED, error, id_in_path, owner_errors

router = APIRouter(prefix="/files", tags=["files"])

FileId = Annotated[str, id_in_path("File id, e.g. file_0123456789abcdef01234567")]

_ERRORS = owner_errors("No such file for this owner")


_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "The dataset as JSON Lines: a multipart form with the file in field `file`, or the "
        "file itself as the body with Content-Type application/jsonl. Streamed to disk; larger than "
        "FTQ_MAX_FILE_BYTES is a 413, past the owner's FTQ_FILE_QUOTA_BYTES a 429.",
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary"}},
                    "required": ["file"],
                }
            },
            "application/jsonl": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


@router.post(
    "",
    status_code=201,
    response_model=FilePublic,
    openapi_extra=_UPLOAD_BODY,
    responses={
        400: error("The multipart body does not parse"),
        403: CROSS_SITE,
        408: error("The body took longer than FTQ_UPLOAD_DEADLINE_SECONDS"),
        413: error("The file is larger than FTQ_MAX_FILE_BYTES"),
        415: error("Neither multipart/form-data nor application/jsonl"),
        429: error(
            "The upload would pass the owner's FTQ_FILE_QUOTA_BYTES (its files and its uploads in progress)"
        ),
        507: error("The server's disk has no room left for it (the partial file is removed)"),
        401: UNAUTHORIZED,
    },
    summary="Upload a dataset file (JSON Lines); it is validated by the worker",
)
async def upload_file(
    request: Request,
    response: Response,
    background: BackgroundTasks,
    owner: LoopOwnerDep,
    filename: str | None = Query(
        None, max_length=1024, description="The name to show for it (default: the multipart filename)."
    ),
) -> FilePublic:
    settings = get_settings()
    content_type = request.headers.get("content-type", "")
    ctype = content_type.split(";")[0].strip().lower()
    if ctype != "multipart/form-data" and ctype not in upload.RAW_TYPES:
        raise UnsupportedMediaType(
            f"content type {ctype or 'none'} is not an upload; send multipart/form-data with the file in "
            "field `file` (curl -F file=@data.jsonl) or the file as application/jsonl "
            "(curl -H 'Content-Type: application/jsonl' --data-binary @data.jsonl)"
        )

    body_bytes = upload.declared_length(request, settings.max_file_bytes)
    file_id = files.new_file_id()
    try:
        part = await anyio.to_thread.run_sync(file_service.new_upload_path, settings, owner, file_id)

        async def reserve(want: int) -> None:
            def run(session: Any) -> None:
                file_service.reserve(session, FileRepository(session, owner), settings, part, want)

            await anyio.to_thread.run_sync(in_thread_session(run))

        limits = upload.Limits(settings.max_file_bytes, reserve, declared=body_bytes)
        got = await upload.receive_request(request, part, limits, deadline=settings.upload_deadline_seconds)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # The partial file is gone (upload.receive); the disk is the server's, so it is not a 4xx.
        raise InsufficientStorage(
            "the server's disk has no room left for this upload; nothing was kept. Try again later, or "
            "ask the operator to free space where uploads are stored (FTQ_DATA_DIR)",
        ) from None
    name = files.display_name(filename or got.filename or "upload.jsonl")

    def store(session: Any) -> FilePublic:
        row = file_service.record(
            session,
            FileRepository(session, owner),
            settings,
            file_id=file_id,
            part=part,
            filename=name,
            size=got.size,
            sha256=got.sha256,
        )
        return file_service.to_public(row)

    public: FilePublic = await anyio.to_thread.run_sync(in_thread_session(store))
    background.add_task(outbox.send_file_validation, file_id)
    response.headers["Location"] = f"/files/{file_id}"
    return public


@router.get(
    "",
    response_model=FileList,
    responses={
        401: _ERRORS[401],
        400: error("A cursor this server did not give"),
    },
    summary="List your files",
)
async def list_files(
    owner: LoopOwnerDep,
    limit: int = Query(50, ge=1, le=500),
    cursor: str | None = Query(None, max_length=32, description="next_cursor of the previous page"),
) -> FileList:
    before = parse_cursor(cursor)

    def page() -> FileList:
        with read_session() as session:
            rows = FileRepository(session, owner).list_page(limit=limit + 1, before_seq=before)
            shown = rows[:limit]
            return FileList(
                data=[file_service.to_public(r) for r in shown],
                next_cursor=str(shown[-1].seq) if len(rows) > limit else None,
            )

    result: FileList = await anyio.to_thread.run_sync(page)
    return result


@router.get(
    "/{file_id}", response_model=FilePublic, responses=_ERRORS, summary="Get a file's status and validation"
)
async def get_file(file_id: FileId, owner: LoopOwnerDep) -> FilePublic:
    def one() -> FilePublic:
        with read_session() as session:
            return file_service.to_public(file_service.get_or_404(FileRepository(session, owner), file_id))

    result: FilePublic = await anyio.to_thread.run_sync(one)
    return result


@router.head(
    "/{file_id}/content",
    responses={
        **_ERRORS,
        200: {
            "content": {"application/jsonl": {}},
            "description": "The headers GET would send (size, type), no body",
        },
    },
    summary="A file's headers, without its bytes",
)
@router.get(
    "/{file_id}/content",
    responses={**_ERRORS, 200: {"content": {"application/jsonl": {}}, "description": "The file's bytes"}},
    response_class=FileResponse,
    summary="Download a file's bytes (streamed)",
)
async def get_content(file_id: FileId, owner: LoopOwnerDep) -> FileResponse:
    settings = get_settings()

    def find() -> tuple[str, str]:
        with read_session() as session:
            row = file_service.get_or_404(FileRepository(session, owner), file_id)
            return row.id, row.filename

    found_id, name = await anyio.to_thread.run_sync(find)
    path = files.file_path(settings.data_path, owner, found_id)
    exists = await anyio.to_thread.run_sync(path.is_file)
    if not exists:
        raise NotFound(f"file {file_id} not found")
    return FileResponse(path, media_type="application/jsonl", filename=name)


@router.delete(
    "/{file_id}",
    status_code=204,
    responses={**_ERRORS, 409: error("A queued or running job uses it")},
    summary="Delete a file and its bytes",
)
async def delete_file(file_id: FileId, owner: LoopOwnerDep) -> Response:
    settings = get_settings()

    def remove(session: Any) -> None:
        file_service.delete(session, FileRepository(session, owner), settings, file_id)

    await anyio.to_thread.run_sync(in_thread_session(remove))
    return Response(status_code=204)
