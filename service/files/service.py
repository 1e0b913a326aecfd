"""The files API's rules: where an upload goes, its row, reading and deleting, and what a job spec's
`dataset.file_id` must be at submit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from ftq.contract import datasets
from ftq.contract.schemas import FileError, FilePublic
from ftq.contract.spec import JobSpec
from ftq.contract.status import FileStatus
from ftq.runtime import files
from ftq.runtime.settings import Settings
from ftq.store.files_repository import FileRepository, utcnow
from ftq.store.models import UploadedFile
from ftq.store.uploads_repository import UploadRepository
from service.errors import Conflict, NotFound, SpecError, TooManyRequests


def to_public(row: UploadedFile) -> FilePublic:
    return FilePublic(
        id=row.id,
        filename=row.filename,
        bytes=row.bytes,
        sha256=row.sha256,
        status=FileStatus(row.status),
        rows=row.rows,
        columns=list(row.columns or []),
        formats=list(row.formats or []),
        methods=list(row.methods or []),
        errors=[FileError.model_validate(e) for e in (row.errors or [])],
        error_count=row.error_count or 0,
        created_at=row.created_at,
    )


def get_or_404(repo: FileRepository, file_id: str) -> UploadedFile:
    row = repo.get(file_id) if files.is_file_id(file_id) else None
    if row is None:
        raise NotFound(f"file {file_id} not found")
    return row


def new_upload_path(settings: Settings, owner: str, file_id: str) -> Path:
    """A fresh temporary path in the owner's folder for the bytes of `file_id` while they arrive."""
    folder = files.owner_dir(settings.data_path, owner)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder / f".{file_id}.part"


# Room an upload reserves beyond what it has received when it needs more (a chunked body, or one longer
# than it said): few reservations per upload, and little held that is not yet written.
RESERVE_STEP = 1024 * 1024


def held_by_uploads(session: Session, owner: str) -> int:
    """What the received parts of the owner's unfinished `/v1` uploads hold: they count in the quota as
    its files do."""
    return UploadRepository(session, owner).bytes_held()


def _fit(
    session: Session, repo: FileRepository, settings: Settings, part: Path, size: int, advice: str
) -> None:
    """Take the owner's quota lock (until the transaction ends) and check that `size` bytes for `part` fit
    beside what the owner's files hold, what its other uploads in flight have reserved and the parts of its
    unfinished `/v1` uploads; TooManyRequests (ending with `advice`) when they do not."""
    repo.hold_quota()
    used = repo.bytes_used()
    flight = files.bytes_in_flight(
        settings.data_path, repo.owner, younger_than=settings.upload_deadline_seconds, besides=part
    )
    flight += held_by_uploads(session, repo.owner)
    if used + flight + size > settings.file_quota_bytes:
        raise TooManyRequests(
            f"this upload would take your files past the {settings.file_quota_bytes} bytes you may keep "
            f"(FTQ_FILE_QUOTA_BYTES; {used} in use, {flight} held by your uploads in progress); {advice}",
            retry_after=60,
        )


def reserve(session: Session, repo: FileRepository, settings: Settings, part: Path, want: int) -> None:
    """Reserve room for `want` bytes of the upload whose bytes arrive in `part`, against the owner's
    quota, under the owner's quota lock (`_fit`). The reservation is the `.part` file's length (a sparse
    file: the room is counted, not taken), which every API process sees; TooManyRequests when it does not
    fit (the upload stops there)."""
    _fit(session, repo, settings, part, want, "delete files you no longer need (DELETE /files/{id}) or wait "
         "for your other uploads")  # fmt: skip
    if part.stat().st_size < want:
        os.truncate(part, want)
    session.commit()


def check_quota(session: Session, repo: FileRepository, settings: Settings, part: Path, size: int) -> None:
    """The `size` bytes received in `part` checked under the owner's quota lock (`_fit`), which stays
    taken until the transaction ends; TooManyRequests when they do not fit, with `part` removed."""
    try:
        _fit(session, repo, settings, part, size, "delete files you no longer need")
    except TooManyRequests:
        part.unlink(missing_ok=True)
        raise


def record(
    session: Session,
    repo: FileRepository,
    settings: Settings,
    *,
    file_id: str,
    part: Path,
    filename: str,
    size: int,
    sha256: str,
) -> UploadedFile:
    """The received bytes become the file `file_id` (status validating), within the owner's quota as it
    is now (another upload may have finished meanwhile), checked and taken under the owner's quota lock.
    The row is committed with whatever the caller's transaction holds (a `/v1` upload's end, whose
    parts then no longer count)."""
    check_quota(session, repo, settings, part, size)
    final = files.file_path(settings.data_path, repo.owner, file_id)
    row = UploadedFile(
        id=file_id,
        owner=repo.owner,
        filename=filename,
        bytes=size,
        sha256=sha256,
        status=FileStatus.validating,
        error_count=0,
        created_at=utcnow(),
    )
    try:
        os.replace(part, final)
        repo.add(row)
        session.commit()
    except BaseException:
        session.rollback()
        final.unlink(missing_ok=True)
        part.unlink(missing_ok=True)
        raise
    return row


def delete(session: Session, repo: FileRepository, settings: Settings, file_id: str) -> None:
    row = get_or_404(repo, file_id)
    using = repo.active_jobs_using(row.id)
    if using:
        raise Conflict(
            f"file {file_id} is used by job(s) {', '.join(using[:5])} that have not ended (queued, "
            "running or paused) or whose evaluation is queued or running; cancel them or wait for them "
            "to end"
        )
    repo.delete(row.id)
    session.commit()
    files.file_path(settings.data_path, repo.owner, row.id).unlink(missing_ok=True)


# At submit ------------------------------------------------------------------------------------------------

_FIELDS = ("file_id", "eval_file_id")


def files_of_spec(spec: JobSpec, repo: FileRepository) -> dict[str, UploadedFile]:
    """The owner's ready files a spec names (by field), or a 422 naming the field: a file that is not
    this owner's reads exactly as one that does not exist."""
    found: dict[str, UploadedFile] = {}
    errors: list[dict[str, Any]] = []
    for name in _FIELDS:
        file_id = getattr(spec.dataset, name)
        if file_id is None:
            continue
        row = repo.get(file_id)
        if row is None:
            errors.append(_error(name, f"no file {file_id} among your files (GET /files)", "not_found"))
        elif row.status != FileStatus.ready:
            why = (
                "it is still being validated; wait until it is ready (ftq files show)"
                if row.status == FileStatus.validating
                else f"it has {row.error_count} problem(s), the first on line "
                f"{(row.errors or [{'line': 0}])[0]['line']}; fix the file and upload it again"
            )
            errors.append(_error(name, f"file {file_id} is {row.status}, not ready: {why}", "file_not_ready"))
        else:
            found[name] = row
    # An evaluation suite's upload (eval.suites[i].file_id): the owner's, and ready.
    for i, suite in enumerate(spec.eval.suites):
        file_id = getattr(suite, "file_id", None)
        if file_id is None:
            continue
        row = repo.get(file_id)
        where = ["body", "eval", "suites", i, "file_id"]
        if row is None:
            errors.append(
                {"loc": where, "msg": f"no file {file_id} among your files (GET /files)", "type": "not_found"}
            )
        elif row.status != FileStatus.ready:
            errors.append(
                {"loc": where, "msg": f"file {file_id} is {row.status}, not ready", "type": "file_not_ready"}
            )
    if errors:
        raise SpecError(errors)
    train = found.get("file_id")
    if train is not None:
        # The method's columns (preference, unpaired preference, ...) and what loss_on can mask: the
        # same rule as for a local file (ftq.contract.datasets.format_problem).
        method_problem = datasets.format_problem(
            spec.dataset,
            spec.training,
            list(train.columns or []),
            set(train.formats or []),
            f"the rows of file {train.id}",
        )
        if method_problem is not None:
            loc, msg = method_problem
            raise SpecError([{"loc": ["body", *loc], "msg": msg, "type": "dataset_error"}])
        # Then that every row holds the format (the columns alone do not say it); `auto` with a preference
        # method is the method's format, which the check above has settled.
        problem = (
            format_problem(spec, train)
            if str(spec.dataset.format) != "auto" or spec.training.method == "sft"
            else None
        )
        if problem is not None:
            field, msg = problem
            raise SpecError([_error(field, msg, "dataset_error", section_field=True)])
    return found


def format_problem(spec: JobSpec, row: UploadedFile) -> tuple[str, str] | None:
    """(dataset field, why) when the file's recorded formats and columns do not hold what the spec
    trains on (dataset.format, its text or messages field)."""
    ds = spec.dataset
    formats = set(row.formats or [])
    columns = set(row.columns or [])
    fmt = str(ds.format)
    if fmt not in ("auto", "text", "messages"):
        if fmt not in formats:
            return "format", (
                f"dataset.format is {fmt} but file {row.id} holds {', '.join(sorted(formats)) or 'no format'}"
            )
        return None
    if fmt == "auto":
        fmt = "messages" if ds.messages_field in columns else "text"
    setting, needed = (
        ("messages_field", ds.messages_field) if fmt == "messages" else ("text_field", ds.text_field)
    )
    if needed in columns:
        return None
    return setting, (
        f"file {row.id} has no field {needed!r} (fields: {', '.join(sorted(columns)) or 'none'}, formats: "
        f"{', '.join(sorted(formats)) or 'none'}); set dataset.{setting} to one of them"
    )


def _error(field: str, msg: str, type_: str, section_field: bool = False) -> dict[str, Any]:
    return {"loc": ["body", "dataset", field], "msg": msg, "type": type_}
