"""`/v1/files` and `/v1/uploads` in OpenAI's shapes, on the native files store (service.files): the same
streamed receive, size cap, owner quota, validation task and owner filter; a file `file_<hex>` is
`file-<hex>` here. A job's result file (`file-result-<hex>`) is made from its metrics when read.

An Upload (a file larger than one request, sent in parts) keeps its state in the owner's files folder,
`uploads/<upload id>/` (upload.json and one file per part), until `complete` joins the parts into an
ordinary file and removes the folder."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, BackgroundTasks, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import Response

from ftq.contract.openai import (
    FileDeleted,
    OpenAIFile,
    OpenAIList,
    Upload,
    UploadComplete,
    UploadCreate,
    UploadPart,
)
from ftq.contract.status import FileStatus
from ftq.runtime import files
from ftq.runtime.settings import Settings, get_settings
from ftq.store import outbox
from ftq.store.db import new_session, read_session
from ftq.store.files_repository import FileRepository
from ftq.store.models import UploadedFile
from ftq.store.openai_repository import OpenAIRepository
from service.deps import LoopOwnerDep, in_thread_session
from service.errors import TooManyRequests
from service.files import service as file_service
from service.files import upload
from service.openai import ids
from service.openai import jobs as v1_jobs
from service.openai.errors import invalid, not_found
from service.openai.pagination import AFTER, listing

router = APIRouter(tags=["openai"])

PURPOSE = "fine-tune"
UPLOAD_TTL_SECONDS = 3600
# The part routes stream their bodies (service.app.BodySizeLimit lets them through).
UPLOAD_PART_PATH = re.compile(r"^/v1/uploads/upload_[0-9a-f]{24}/parts$")
_UPLOAD_ID = re.compile(r"^upload_[0-9a-f]{24}$")
_PART_ID = re.compile(r"^part_[0-9a-f]{24}$")

V1Id = Annotated[str, PathParam(min_length=1, max_length=64)]


def to_openai(row: UploadedFile) -> OpenAIFile:
    status = {FileStatus.validating: "uploaded", FileStatus.ready: "processed"}.get(
        FileStatus(row.status), "error"
    )
    details = None
    if row.status == FileStatus.invalid:
        details = "; ".join(f"line {e['line']}: {e['message']}" for e in (row.errors or [])[:5])
    return OpenAIFile(
        id=ids.file_out(row.id),
        bytes=row.bytes,
        created_at=int(row.created_at.timestamp()),
        filename=row.filename,
        purpose=PURPOSE,
        status=status,  # type: ignore[arg-type]
        status_details=details,
    )


def _check_purpose(purpose: str | None) -> None:
    if purpose != PURPOSE:
        raise invalid(
            f"purpose must be {PURPOSE!r} on this server (it fine-tunes), not {purpose!r}", "purpose"
        )


def _limits(
    owner: str, settings: Settings, part: Path, *, max_bytes: int | None = None, declared: int | None = None
) -> upload.Limits:
    """The size cap and the owner's quota as the native upload reserves it (its files, its uploads in
    flight, and here also the parts of its unfinished `/v1` uploads)."""

    async def reserve(want: int) -> None:
        def run(session: Any) -> None:
            pending = _pending_bytes(settings, owner, besides=part)
            file_service.reserve(
                session, FileRepository(session, owner), settings, part, want, also_held=pending
            )

        await anyio.to_thread.run_sync(in_thread_session(run))

    cap = settings.max_file_bytes if max_bytes is None else max_bytes
    return upload.Limits(cap, reserve, declared=declared)


async def _receive(request: Request, path: Path, limits: upload.Limits, field: str) -> upload.Received:
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "multipart/form-data":
        raise invalid(f"send the {field} as multipart/form-data (field `{field}`)", field)
    limits.declared = upload.declared_length(request, limits.max_bytes)
    deadline = get_settings().upload_deadline_seconds
    return await upload.receive_request(request, path, limits, deadline=deadline, field=field)


def _record(
    owner: str, settings: Settings, file_id: str, part: Path, name: str, got_size: int, sha: str
) -> Any:
    def store(session: Any) -> OpenAIFile:
        row = file_service.record(
            session,
            FileRepository(session, owner),
            settings,
            file_id=file_id,
            part=part,
            filename=name,
            size=got_size,
            sha256=sha,
        )
        return to_openai(row)

    return in_thread_session(store)


# Files ----------------------------------------------------------------------------------------------------


@router.post("/v1/files", response_model=OpenAIFile, summary="Upload a file (OpenAI: files.create)")
async def create_file(request: Request, background: BackgroundTasks, owner: LoopOwnerDep) -> OpenAIFile:
    settings = get_settings()
    file_id = files.new_file_id()
    part = await anyio.to_thread.run_sync(file_service.new_upload_path, settings, owner, file_id)
    got = await _receive(request, part, _limits(owner, settings, part), "file")
    try:
        _check_purpose(got.fields.get("purpose"))
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    name = files.display_name(got.filename or "upload.jsonl")
    result: OpenAIFile = await anyio.to_thread.run_sync(
        _record(owner, settings, file_id, part, name, got.size, got.sha256)
    )
    background.add_task(outbox.send_file_validation, file_id)
    return result


@router.get("/v1/files", response_model=OpenAIList[OpenAIFile], summary="List files (OpenAI: files.list)")
def list_files(
    owner: LoopOwnerDep,
    after: str | None = AFTER,
    limit: int = Query(10_000, ge=1, le=10_000),
    purpose: str | None = Query(None, max_length=64),
    order: str = Query("desc", pattern="^(asc|desc)$"),
) -> OpenAIList[OpenAIFile]:
    if purpose is not None and purpose != PURPOSE:
        return listing([], False, lambda f: f.id)
    with read_session() as session:
        repo = FileRepository(session, owner)
        before = None
        if after is not None:
            native = ids.file_in(after)
            row = repo.get(native) if native else None
            if row is None:
                raise not_found(f"No such File object: {after}", "after")
            before = row.seq
        if order == "asc":
            rows = list(reversed(repo.list_page(limit=100_000, before_seq=None)))
            if before is not None:
                rows = [r for r in rows if r.seq > before]
            rows = rows[: limit + 1]
        else:
            rows = repo.list_page(limit=limit + 1, before_seq=before)
        shown = [to_openai(r) for r in rows[:limit]]
        return listing(shown, len(rows) > limit, lambda f: f.id)


def _get_row(repo: FileRepository, v1_id: str) -> UploadedFile:
    native = ids.file_in(v1_id)
    row = repo.get(native) if native else None
    if row is None:
        raise not_found(f"No such File object: {v1_id}", "file_id")
    return row


@router.get("/v1/files/{file_id}", response_model=OpenAIFile, summary="A file (OpenAI: files.retrieve)")
def retrieve_file(file_id: V1Id, owner: LoopOwnerDep) -> OpenAIFile:
    with read_session() as session:
        if ids.result_file_job(file_id):
            return v1_jobs.result_file(OpenAIRepository(session, owner), file_id)[0]
        return to_openai(_get_row(FileRepository(session, owner), file_id))


@router.get(
    "/v1/files/{file_id}/content",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "The file's bytes"}},
    summary="A file's bytes (OpenAI: files.content)",
)
def file_content(file_id: V1Id, owner: LoopOwnerDep) -> Response:
    settings = get_settings()
    with read_session() as session:
        if ids.result_file_job(file_id):
            _, content = v1_jobs.result_file(OpenAIRepository(session, owner), file_id)
            return Response(content, media_type="text/csv")
        row = _get_row(FileRepository(session, owner), file_id)
        path = files.file_path(settings.data_path, owner, row.id)
    from fastapi.responses import FileResponse

    if not path.is_file():
        raise not_found(f"No such File object: {file_id}", "file_id")
    return FileResponse(path, media_type="application/octet-stream", filename=row.filename)


@router.delete(
    "/v1/files/{file_id}", response_model=FileDeleted, summary="Delete a file (OpenAI: files.delete)"
)
def delete_file(file_id: V1Id, owner: LoopOwnerDep) -> FileDeleted:
    settings = get_settings()
    native = ids.file_in(file_id)
    if native is None:
        raise not_found(f"No such File object: {file_id}", "file_id")
    session = new_session()
    try:
        file_service.delete(session, FileRepository(session, owner), settings, native)
    finally:
        session.close()
    return FileDeleted(id=file_id)


# Uploads --------------------------------------------------------------------------------------------------


def _upload_dir(settings: Settings, owner: str, upload_id: str) -> Path:
    if not _UPLOAD_ID.match(upload_id):
        raise not_found(f"No such Upload object: {upload_id}", "upload_id")
    return files.owner_dir(settings.data_path, owner) / "uploads" / upload_id


def _pending_bytes(settings: Settings, owner: str, besides: Path | None = None) -> int:
    """What the owner's unfinished uploads hold (but `besides`, a part being written), which counts in
    the quota as files do; uploads that expired or were cancelled are removed on the way."""
    root = files.owner_dir(settings.data_path, owner) / "uploads"
    if not root.is_dir():
        return 0
    total, now = 0, time.time()
    for folder in root.iterdir():
        if not _UPLOAD_ID.match(folder.name) or folder.is_symlink() or not folder.is_dir():
            continue
        try:
            state = json.loads((folder / "upload.json").read_text())
        except (OSError, ValueError):
            state = {"status": "broken", "expires_at": 0}
        if state.get("status") != "pending" or state.get("expires_at", 0) < now:
            shutil.rmtree(folder, ignore_errors=True)
            continue
        total += sum(p.stat().st_size for p in folder.glob("part_*") if p != besides)
    return total


def _read_state(folder: Path, upload_id: str) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads((folder / "upload.json").read_text())
    except (FileNotFoundError, ValueError):
        raise not_found(f"No such Upload object: {upload_id}", "upload_id") from None
    if state["status"] == "pending" and state["expires_at"] < time.time():
        state["status"] = "expired"
    return state


def _write_state(folder: Path, state: dict[str, Any]) -> None:
    tmp = folder / "upload.json.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, folder / "upload.json")


def _upload_out(state: dict[str, Any], file: OpenAIFile | None = None) -> Upload:
    return Upload(
        id=state["id"],
        bytes=state["bytes"],
        created_at=state["created_at"],
        expires_at=state["expires_at"],
        filename=state["filename"],
        purpose=state["purpose"],
        status=state["status"],
        file=file,
    )


@router.post(
    "/v1/uploads", response_model=Upload, summary="Start an upload in parts (OpenAI: uploads.create)"
)
def create_upload(body: UploadCreate, owner: LoopOwnerDep) -> Upload:
    settings = get_settings()
    _check_purpose(body.purpose)
    if body.bytes > settings.max_file_bytes:
        raise invalid(
            f"bytes is over the {settings.max_file_bytes} bytes a file may have (FTQ_MAX_FILE_BYTES)", "bytes"
        )
    session = new_session()
    try:
        used = FileRepository(session, owner).bytes_used() + _pending_bytes(settings, owner)
    finally:
        session.close()
    if used + body.bytes > settings.file_quota_bytes:
        raise TooManyRequests(
            f"this upload would take your files past the {settings.file_quota_bytes} bytes you may keep "
            f"(FTQ_FILE_QUOTA_BYTES; {used} in use)",
            retry_after=60,
        )
    upload_id = "upload_" + secrets.token_hex(12)
    folder = _upload_dir(settings, owner, upload_id)
    folder.mkdir(mode=0o700, parents=True)
    now = int(time.time())
    state = {
        "id": upload_id,
        "bytes": body.bytes,
        "filename": files.display_name(body.filename),
        "purpose": body.purpose,
        "created_at": now,
        "expires_at": now + UPLOAD_TTL_SECONDS,
        "status": "pending",
        "parts": [],
    }
    _write_state(folder, state)
    return _upload_out(state)


@router.post(
    "/v1/uploads/{upload_id}/parts",
    response_model=UploadPart,
    summary="Add a part (OpenAI: uploads.parts.create)",
)
async def add_part(upload_id: V1Id, request: Request, owner: LoopOwnerDep) -> UploadPart:
    settings = get_settings()
    folder = _upload_dir(settings, owner, upload_id)
    state = await anyio.to_thread.run_sync(_read_state, folder, upload_id)
    if state["status"] != "pending":
        raise invalid(f"upload {upload_id} is {state['status']}; parts go to a pending upload", "upload_id")
    held = sum(p.stat().st_size for p in folder.glob("part_*"))
    # A part may hold what is left of the upload's declared bytes, within the owner's quota (which the
    # parts of every unfinished upload count in).
    part_id = "part_" + secrets.token_hex(12)
    part = folder / part_id
    limits = _limits(owner, settings, part, max_bytes=max(0, state["bytes"] - held))
    await _receive(request, part, limits, "data")
    return UploadPart(id=part_id, created_at=int(time.time()), upload_id=upload_id)


@router.post(
    "/v1/uploads/{upload_id}/complete",
    response_model=Upload,
    summary="Join the parts into a file (OpenAI: uploads.complete)",
)
async def complete_upload(
    upload_id: V1Id, body: UploadComplete, background: BackgroundTasks, owner: LoopOwnerDep
) -> Upload:
    settings = get_settings()
    folder = _upload_dir(settings, owner, upload_id)
    state = await anyio.to_thread.run_sync(_read_state, folder, upload_id)
    if state["status"] != "pending":
        raise invalid(f"upload {upload_id} is {state['status']}, not pending", "upload_id")
    for part_id in body.part_ids:
        if not _PART_ID.match(part_id) or not (folder / part_id).is_file():
            raise invalid(f"upload {upload_id} has no part {part_id}", "part_ids")
    if len(set(body.part_ids)) != len(body.part_ids):
        raise invalid("part_ids names a part twice", "part_ids")
    file_id = files.new_file_id()
    target = await anyio.to_thread.run_sync(file_service.new_upload_path, settings, owner, file_id)

    def join() -> tuple[int, str]:
        import hashlib

        digest, size = hashlib.sha256(), 0
        with open(target, "xb") as out:
            for part_id in body.part_ids:
                with open(folder / part_id, "rb") as src:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        return size, digest.hexdigest()

    size, sha = await anyio.to_thread.run_sync(join)
    if size != state["bytes"]:
        target.unlink(missing_ok=True)
        raise invalid(
            f"the parts hold {size} bytes and the upload was created for {state['bytes']}", "part_ids"
        )
    file: OpenAIFile = await anyio.to_thread.run_sync(
        _record(owner, settings, file_id, target, state["filename"], size, sha)
    )
    background.add_task(outbox.send_file_validation, file_id)
    state["status"] = "completed"
    await anyio.to_thread.run_sync(shutil.rmtree, folder, True)
    return _upload_out(state, file)


@router.post(
    "/v1/uploads/{upload_id}/cancel",
    response_model=Upload,
    summary="Cancel an upload (OpenAI: uploads.cancel)",
)
def cancel_upload(upload_id: V1Id, owner: LoopOwnerDep) -> Upload:
    settings = get_settings()
    folder = _upload_dir(settings, owner, upload_id)
    state = _read_state(folder, upload_id)
    if state["status"] == "pending":
        state["status"] = "cancelled"
        shutil.rmtree(folder, ignore_errors=True)
    return _upload_out(state)
