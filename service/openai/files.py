"""`/v1/files` and `/v1/uploads` in OpenAI's shapes, on the native files store (service.files): the same
streamed receive, size cap, owner quota, validation task and owner filter; a file `file_<hex>` is
`file-<hex>` here. A job's result file (`file-result-<hex>`) is made from its metrics when read.

An Upload (a file larger than one request, sent in parts) is a row in the store with a row per part
(ftq.store.uploads_repository); a part's bytes are in the owner's files folder, `uploads/<upload id>/`,
and count in the owner's quota until the upload ends. `complete` claims the upload by a compare-and-set
(pending -> completing), so of racing `complete`s one joins the parts into an ordinary file and the
others are 409s that leave nothing behind; a part, a `cancel` or a `complete` of an upload that is not
pending is a 409 too."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, BackgroundTasks, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import Response
from sqlalchemy.orm import Session

from ftq.contract.openai import (
    FileDeleted,
    OpenAIErrorBody,
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
from ftq.store import outbox, uploads_repository
from ftq.store.db import new_session, read_session
from ftq.store.files_repository import FileRepository
from ftq.store.models import OpenAIUpload, OpenAIUploadPart, UploadedFile
from ftq.store.openai_repository import OpenAIRepository
from ftq.store.uploads_repository import UploadRepository
from service.deps import LoopOwnerDep, in_thread_session
from service.errors import PayloadTooLarge, TooManyRequests
from service.files import service as file_service
from service.files import upload
from service.openai import ids
from service.openai import jobs as v1_jobs
from service.openai.errors import OpenAIError, invalid, not_found
from service.openai.pagination import AFTER, listing

router = APIRouter(tags=["openai"])

PURPOSE = "fine-tune"
UPLOAD_TTL_SECONDS = 3600
_MD5 = re.compile(r"^[0-9a-f]{32}$")

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
    owner: str, settings: Settings, part: Path, *, max_bytes: int | None = None, too_large: str | None = None
) -> upload.Limits:
    """The size cap (or `max_bytes`, refused with `too_large`) and the owner's quota as the native upload
    reserves it (its files, its uploads in flight, the parts of its unfinished `/v1` uploads)."""

    async def reserve(want: int) -> None:
        def run(session: Any) -> None:
            file_service.reserve(session, FileRepository(session, owner), settings, part, want)

        await anyio.to_thread.run_sync(in_thread_session(run))

    cap = settings.max_file_bytes if max_bytes is None else max_bytes
    return upload.Limits(cap, reserve, too_large=too_large)


async def _receive(request: Request, path: Path, limits: upload.Limits, field: str) -> upload.Received:
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "multipart/form-data":
        raise invalid(f"send the {field} as multipart/form-data (field `{field}`)", field)
    limits.declared = upload.declared_length(request, limits.max_bytes, limits.too_large)
    deadline = get_settings().upload_deadline_seconds
    return await upload.receive_request(request, path, limits, deadline=deadline, field=field)


def _store_file(
    session: Session, owner: str, settings: Settings, file_id: str, part: Path, name: str, size: int, sha: str
) -> OpenAIFile:
    row = file_service.record(
        session,
        FileRepository(session, owner),
        settings,
        file_id=file_id,
        part=part,
        filename=name,
        size=size,
        sha256=sha,
    )
    return to_openai(row)


def _record(
    owner: str, settings: Settings, file_id: str, part: Path, name: str, got_size: int, sha: str
) -> Callable[[], OpenAIFile]:
    return in_thread_session(
        lambda session: _store_file(session, owner, settings, file_id, part, name, got_size, sha)
    )


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

_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {
        "model": OpenAIErrorBody,
        "description": "The upload is not pending: another `complete` has claimed it, or it is completed, "
        "cancelled or expired",
    }
}
_PART_ERRORS: dict[int | str, dict[str, Any]] = {
    **_CONFLICT,
    413: {
        "model": OpenAIErrorBody,
        "description": "The part would take the upload past its declared `bytes`",
    },
}


def _check_upload_id(upload_id: str) -> None:
    if not files.is_upload_id(upload_id):
        raise not_found(f"No such Upload object: {upload_id}", "upload_id")


def _shown_status(row: OpenAIUpload) -> str:
    """The status as OpenAI's Upload has it: a pending upload past its expiry is `expired` (until the
    sweep makes it so), one being completed reads as pending."""
    if row.status in uploads_repository.LIVE:
        return "expired" if row.expires_at <= uploads_repository.utcnow() else "pending"
    return row.status


def _not_pending(row: OpenAIUpload | None, upload_id: str, doing: str) -> Exception:
    """The refusal of `doing` on an upload that is not pending: a 409 saying what it is."""
    if row is None:
        return not_found(f"No such Upload object: {upload_id}", "upload_id")
    if row.status == uploads_repository.COMPLETING:
        why = "is already being completed by another request"
    elif row.status == uploads_repository.COMPLETED:
        why = "is already completed"
        if row.file_id:
            why += f" (file {ids.file_out(row.file_id)})"
    elif row.status == uploads_repository.PENDING:
        why = "has expired"
    else:
        why = f"is {row.status}"
    return OpenAIError(
        f"upload {upload_id} {why}; {doing} a pending upload only", param="upload_id", status=409
    )


def _upload_out(row: OpenAIUpload, file: OpenAIFile | None = None) -> Upload:
    return Upload(
        id=row.id,
        bytes=row.bytes,
        created_at=int(row.created_at.timestamp()),
        expires_at=int(row.expires_at.timestamp()),
        filename=row.filename,
        purpose=row.purpose,
        status=_shown_status(row),  # type: ignore[arg-type]
        file=file,
    )


def _sweep(session: Session, settings: Settings, owner: str) -> None:
    """The owner's uploads that expired are ended and their parts removed (the worker sweeps every owner's
    hourly too)."""
    uploads_repository.sweep(session, settings.data_path, owner=owner)


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
        _sweep(session, settings, owner)
        used = FileRepository(session, owner).bytes_used() + file_service.held_by_uploads(session, owner)
        if used + body.bytes > settings.file_quota_bytes:
            raise TooManyRequests(
                f"this upload would take your files past the {settings.file_quota_bytes} bytes you may keep "
                f"(FTQ_FILE_QUOTA_BYTES; {used} in use)",
                retry_after=60,
            )
        now = uploads_repository.utcnow().replace(microsecond=0)
        row = OpenAIUpload(
            id="upload_" + secrets.token_hex(12),
            owner=owner,
            filename=files.display_name(body.filename),
            purpose=body.purpose,
            bytes=body.bytes,
            mime_type=body.mime_type,
            status=uploads_repository.PENDING,
            created_at=now,
            expires_at=now + timedelta(seconds=UPLOAD_TTL_SECONDS),
        )
        UploadRepository(session, owner).add(row)
        session.commit()
    finally:
        session.close()
    return _upload_out(row)


def _too_large(upload_id: str, declared: int, received: int) -> str:
    return (
        f"the part would take upload {upload_id} past the {declared} bytes it was created for (its "
        f"`bytes`; {received} received in its parts so far); send at most {max(0, declared - received)} "
        "more bytes, or create an upload of the right size"
    )


@router.post(
    "/v1/uploads/{upload_id}/parts",
    response_model=UploadPart,
    responses=_PART_ERRORS,
    summary="Add a part (OpenAI: uploads.parts.create)",
)
async def add_part(upload_id: V1Id, request: Request, owner: LoopOwnerDep) -> UploadPart:
    settings = get_settings()
    _check_upload_id(upload_id)

    def look(session: Session) -> tuple[int, int]:
        _sweep(session, settings, owner)
        uploads = UploadRepository(session, owner)
        row = uploads.get(upload_id)
        if row is None or _shown_status(row) != "pending" or row.status != uploads_repository.PENDING:
            raise _not_pending(row, upload_id, "parts go to")
        return row.bytes, uploads.received(upload_id)

    declared, received = await anyio.to_thread.run_sync(in_thread_session(look))
    # The part arrives as an upload in flight does (`.file_<hex>.part`, its room reserved in the owner's
    # quota as it streams), at most what is left of the upload's declared bytes.
    temp = await anyio.to_thread.run_sync(file_service.new_upload_path, settings, owner, files.new_file_id())
    limits = _limits(
        owner,
        settings,
        temp,
        max_bytes=max(0, declared - received),
        too_large=_too_large(upload_id, declared, received),
    )
    got = await _receive(request, temp, limits, "data")
    part_id = "part_" + secrets.token_hex(12)
    folder = files.upload_dir(settings.data_path, owner, upload_id)
    final = folder / part_id

    def record(session: Session) -> None:
        # The quota lock, then the upload's row (held while pending): a `complete` or `cancel` waits for
        # this part, or this part sees the upload ended. The upload's room and the owner's quota are
        # checked again with every part received meanwhile.
        file_repo = FileRepository(session, owner)
        file_repo.hold_quota()
        uploads = UploadRepository(session, owner)
        now = uploads_repository.utcnow()
        if not uploads.hold_pending(upload_id, now=now):
            raise _not_pending(uploads.get(upload_id), upload_id, "parts go to")
        have = uploads.received(upload_id)
        if have + got.size > declared:
            raise PayloadTooLarge(_too_large(upload_id, declared, have))
        file_service.check_quota(session, file_repo, settings, temp, got.size)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.replace(temp, final)
        try:
            uploads.add_part(
                OpenAIUploadPart(
                    id=part_id,
                    upload_id=upload_id,
                    bytes=got.size,
                    path=str(final.relative_to(files.owner_dir(settings.data_path, owner))),
                    created_at=now,
                )
            )
            session.commit()
        except BaseException:
            session.rollback()
            final.unlink(missing_ok=True)
            raise

    try:
        await anyio.to_thread.run_sync(in_thread_session(record))
    finally:
        temp.unlink(missing_ok=True)
    return UploadPart(id=part_id, created_at=int(time.time()), upload_id=upload_id)


_JOINED = ".joined"  # the file `complete` writes in the upload's folder, renamed into the owner's files


@router.post(
    "/v1/uploads/{upload_id}/complete",
    response_model=Upload,
    responses=_CONFLICT,
    summary="Join the parts into a file (OpenAI: uploads.complete)",
)
async def complete_upload(
    upload_id: V1Id, body: UploadComplete, background: BackgroundTasks, owner: LoopOwnerDep
) -> Upload:
    settings = get_settings()
    _check_upload_id(upload_id)
    if len(set(body.part_ids)) != len(body.part_ids):
        raise invalid("part_ids names a part twice", "part_ids")
    want_md5 = (body.md5 or "").strip().lower() or None
    if want_md5 is not None and not _MD5.match(want_md5):
        raise invalid("md5 must be the 32 hexadecimal digits of the file's MD5 digest", "md5")

    def claim(session: Session) -> tuple[OpenAIUpload, list[Path]]:
        """The upload's row and its parts' paths in the order of part_ids, once this request has claimed
        it (pending -> completing); a 409 when another has, or it is not pending."""
        uploads = UploadRepository(session, owner)
        row = uploads.get(upload_id)
        if row is None or row.status != uploads_repository.PENDING or _shown_status(row) != "pending":
            raise _not_pending(row, upload_id, "complete")
        parts = {p.id: p for p in uploads.parts(upload_id)}
        for part_id in body.part_ids:
            if part_id not in parts:
                raise invalid(f"upload {upload_id} has no part {part_id}", "part_ids")
        size = sum(parts[p].bytes for p in body.part_ids)
        if size != row.bytes:
            raise invalid(
                f"the parts hold {size} bytes and the upload was created for {row.bytes}", "part_ids"
            )
        if not uploads.claim(upload_id, now=uploads_repository.utcnow()):
            session.rollback()
            raise _not_pending(uploads.get(upload_id), upload_id, "complete")
        session.commit()
        home = files.owner_dir(settings.data_path, owner)
        return row, [home / parts[p].path for p in body.part_ids]

    row, sources = await anyio.to_thread.run_sync(in_thread_session(claim))
    # This request alone holds the upload now: whatever happens, it ends completed or pending again, and
    # leaves no file of its own behind.
    target = files.upload_dir(settings.data_path, owner, upload_id) / _JOINED
    file_id = files.new_file_id()
    done = False
    try:

        def join() -> tuple[int, str, str]:
            sha, md5, size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # none yet: an upload of no parts
            with open(target, "wb") as out:
                for source in sources:
                    with open(source, "rb") as src:
                        while chunk := src.read(1 << 20):
                            sha.update(chunk)
                            md5.update(chunk)
                            size += len(chunk)
                            out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            return size, sha.hexdigest(), md5.hexdigest()

        size, sha, md5 = await anyio.to_thread.run_sync(join)
        if size != row.bytes:
            raise invalid(
                f"the parts hold {size} bytes and the upload was created for {row.bytes}", "part_ids"
            )
        if want_md5 is not None and md5 != want_md5:
            raise invalid(
                f"md5 is {want_md5} but the parts joined in the order of part_ids have md5 {md5}; no file "
                "was made (the upload is still pending: complete it again with the right parts in the right "
                "order, or cancel it)",
                "md5",
            )

        def store(session: Session) -> OpenAIFile:
            # The quota lock first (as a part's record takes it), then the upload's end and the file's
            # row in one transaction: the parts stop counting in the quota as the file starts to.
            repo = FileRepository(session, owner)
            repo.hold_quota()
            uploads = UploadRepository(session, owner)
            if not uploads.finish(upload_id, file_id):
                raise _not_pending(uploads.get(upload_id), upload_id, "complete")
            return _store_file(session, owner, settings, file_id, target, row.filename, size, sha)

        file: OpenAIFile = await anyio.to_thread.run_sync(in_thread_session(store))
        done = True
    finally:
        if not done:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_give_back, target, upload_id, owner)
    background.add_task(outbox.send_file_validation, file_id)
    await anyio.to_thread.run_sync(
        shutil.rmtree, files.upload_dir(settings.data_path, owner, upload_id), True
    )
    row.status, row.file_id = uploads_repository.COMPLETED, file_id
    return _upload_out(row, file)


def _give_back(target: Path, upload_id: str, owner: str) -> None:
    """A claimed upload that made no file: the joined bytes removed, the upload pending again."""
    target.unlink(missing_ok=True)

    def release(session: Session) -> None:
        UploadRepository(session, owner).release(upload_id)
        session.commit()

    in_thread_session(release)()


@router.post(
    "/v1/uploads/{upload_id}/cancel",
    response_model=Upload,
    responses=_CONFLICT,
    summary="Cancel an upload (OpenAI: uploads.cancel)",
)
def cancel_upload(upload_id: V1Id, owner: LoopOwnerDep) -> Upload:
    settings = get_settings()
    _check_upload_id(upload_id)
    session = new_session()
    try:
        _sweep(session, settings, owner)
        uploads = UploadRepository(session, owner)
        cancelled = uploads.cancel(upload_id, now=uploads_repository.utcnow())
        session.commit()
        row = uploads.get(upload_id)
        if row is None:
            raise not_found(f"No such Upload object: {upload_id}", "upload_id")
        if row.status == uploads_repository.COMPLETING:
            raise _not_pending(row, upload_id, "cancel")
    finally:
        session.close()
    if cancelled:
        shutil.rmtree(files.upload_dir(settings.data_path, owner, upload_id), ignore_errors=True)
    return _upload_out(row)
