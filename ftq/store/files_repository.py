"""Every SQL statement about uploaded files (the `files` table).

`FileRepository(session, owner)` is what the API uses: every read goes through `_readable()`, the one
place the owner filter is applied. The module-level functions are the system's own (the validation
task, the relay, the worker resolving a job's files); the validation's status change is a
compare-and-set from `validating`, so a task delivered twice changes nothing the second time.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, false, func, or_, select, update
from sqlalchemy.orm import Session

from ftq.contract.status import ACTIVE, FileStatus
from ftq.runtime.files import Validation
from ftq.store.db import lock_for_transaction
from ftq.store.models import Evaluation, Job, UploadedFile
from ftq.store.owned import OwnedRepository


def utcnow() -> datetime:
    return datetime.now(UTC)


def file_ids_of(value: Any) -> set[str]:
    """The values of every `file_id`/`*_file_id` key in a stored spec (or a part of one), at any depth: a
    field the spec adds later is found without being listed here."""
    found: set[str] = set()
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                if isinstance(key, str) and key.endswith("file_id") and isinstance(item, str):
                    found.add(item)
                else:
                    stack.append(item)
        elif isinstance(node, list):
            stack.extend(node)
    return found


class FileRepository(OwnedRepository):
    model = UploadedFile

    def get(self, file_id: str) -> UploadedFile | None:
        return self.session.scalars(self._readable().where(UploadedFile.id == file_id)).first()

    def list_page(self, *, limit: int, before_seq: int | None) -> list[UploadedFile]:
        stmt = self._readable()
        if before_seq is not None:
            stmt = stmt.where(UploadedFile.seq < before_seq)
        return list(self.session.scalars(stmt.order_by(UploadedFile.seq.desc()).limit(limit)))

    def hold_quota(self) -> None:
        """Hold this owner's quota until the transaction ends, so that two uploads finishing together
        cannot both fit in room that only one of them fits in: a transaction-scoped advisory lock per
        owner on PostgreSQL; on SQLite, the database's write lock, taken now (by a write that changes no
        row) instead of at the insert that follows the check."""
        if not lock_for_transaction(self.session, f"file-quota:{self.owner}"):
            self.session.execute(update(UploadedFile).where(false()).values(bytes=UploadedFile.bytes))

    def bytes_used(self) -> int:
        """What this owner's files hold, for the quota."""
        stmt = select(func.coalesce(func.sum(UploadedFile.bytes), 0)).where(UploadedFile.owner == self.owner)
        return int(self.session.scalar(stmt) or 0)

    def add(self, row: UploadedFile) -> None:
        if row.owner != self.owner:
            raise ValueError("a file is added for the repository's owner only")
        self.session.add(row)
        self.session.flush()

    def active_jobs_using(self, file_id: str) -> list[str]:
        """Ids of this owner's jobs that still need the file: a job not yet ended (queued, starting,
        running, cancelling or paused) whose spec names it in any `*file_id` field (`dataset.file_id`,
        `dataset.eval_file_id`, `eval.suites[i].file_id`, ...), and an ended job whose evaluation is
        queued or running and whose `eval` section names it.

        The specs are read in Python: an owner has at most FTQ_MAX_ACTIVE_JOBS_PER_OWNER active jobs, and
        a JSON path query is written differently for each store."""
        active = [s.value for s in ACTIVE]
        evaluating = select(Evaluation.job_id).where(Evaluation.status.in_(active))
        stmt = (
            select(Job.id, Job.status, Job.spec)
            .where(Job.owner == self.owner, or_(Job.status.in_(active), Job.id.in_(evaluating)))
            .order_by(Job.seq)
        )
        using = []
        for job_id, status, spec in self.session.execute(stmt):
            named = spec if status in active else (spec or {}).get("eval")
            if file_id in file_ids_of(named):
                using.append(str(job_id))
        return using

    def delete(self, file_id: str) -> bool:
        stmt = delete(UploadedFile).where(UploadedFile.owner == self.owner, UploadedFile.id == file_id)
        return bool(self.session.execute(stmt).rowcount)  # type: ignore[attr-defined]


# System operations ---------------------------------------------------------------------------------------


def get_file(session: Session, file_id: str) -> UploadedFile | None:
    return session.scalars(select(UploadedFile).where(UploadedFile.id == file_id)).first()


def get_owned_file(session: Session, owner: str, file_id: str) -> UploadedFile | None:
    """The worker's lookup of a job's file: the job's owner's, or none."""
    return FileRepository(session, owner).get(file_id)


def finish_validation(session: Session, file_id: str, result: Validation) -> bool:
    """validating -> ready | invalid with what the validation found (compare-and-set)."""
    stmt = (
        update(UploadedFile)
        .where(UploadedFile.id == file_id, UploadedFile.status == FileStatus.validating)
        .values(
            status=FileStatus.ready if result.ok else FileStatus.invalid,
            rows=result.rows,
            columns=result.columns,
            formats=result.formats,
            methods=result.methods,
            errors=result.errors,
            error_count=result.error_count,
            validated_at=utcnow(),
        )
        .execution_options(synchronize_session=False)
    )
    return bool(session.execute(stmt).rowcount)  # type: ignore[attr-defined]


def mark_validation_sent(session: Session, file_id: str) -> None:
    session.execute(
        update(UploadedFile).where(UploadedFile.id == file_id).values(validation_sent_at=utcnow())
    )


def validations_to_send(
    session: Session, *, older_than: timedelta, resend_after: timedelta, limit: int = 100
) -> Sequence[str]:
    """Files still `validating` whose task was never sent (after `older_than`: the API sends at once),
    or was sent longer than `resend_after` ago (its worker died with it: validating is safe twice)."""
    now = utcnow()
    stmt = (
        select(UploadedFile.id)
        .where(
            UploadedFile.status == FileStatus.validating,
            or_(
                UploadedFile.validation_sent_at.is_(None) & (UploadedFile.created_at <= now - older_than),
                UploadedFile.validation_sent_at <= now - resend_after,
            ),
        )
        .order_by(UploadedFile.seq)
        .limit(limit)
    )
    return list(session.scalars(stmt))
