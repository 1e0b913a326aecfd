"""Every SQL statement about OpenAI-compatible uploads (`/v1/uploads`: the `uploads` and `upload_parts`
tables).

`UploadRepository(session, owner)` is what the API uses: every statement goes through `_owned()`, the
one place the owner filter is applied (a part is reached through its upload). An upload's status moves
by compare-and-set only (`UPDATE ... WHERE status = <expected>`, one row or none), so of two requests
that race (two `complete`s, a `complete` and a `cancel`, a part and a `complete`) exactly one wins:

    pending --claim--> completing --finish--> completed
       |  ^                |
       |  +----release-----+          (the join failed: a wrong md5, the quota)
       +--cancel--> cancelled
       +--expire--> expired           (past expires_at; a `completing` one stuck long after it too)

The parts of a `pending` or `completing` upload count in the owner's file quota (`bytes_held`); the
transaction that ends an upload deletes its part rows, and the caller removes their bytes after it.
The module-level functions are the system's own; `sweep` (rows and folders, of one owner at its next
upload request, of every owner in the worker's hourly sweep) is the one place ended uploads' parts go.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import ColumnElement, Select, and_, delete, func, or_, select, update
from sqlalchemy.orm import Session

from ftq.runtime import files
from ftq.store.models import OpenAIUpload, OpenAIUploadPart

PENDING, COMPLETING, COMPLETED, CANCELLED, EXPIRED = (
    "pending",
    "completing",
    "completed",
    "cancelled",
    "expired",
)
# The statuses whose parts are kept (and count in the quota).
LIVE = (PENDING, COMPLETING)
# A `completing` upload is taken for one whose `complete` died mid-join this long after it expired.
STUCK_AFTER = timedelta(hours=1)


def utcnow() -> datetime:
    return datetime.now(UTC)


def _rowcount(result: object) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


def _open(now: datetime) -> tuple[ColumnElement[bool], ColumnElement[bool]]:
    """An upload that takes parts, a `complete` or a `cancel`: pending and not expired."""
    return OpenAIUpload.status == PENDING, OpenAIUpload.expires_at > now


def _due(now: datetime, stuck_before: datetime) -> ColumnElement[bool]:
    """Uploads to expire: pending ones past expires_at, and `completing` ones whose `complete` has not
    ended long after it (its process died mid-join)."""
    return or_(
        and_(OpenAIUpload.status == PENDING, OpenAIUpload.expires_at <= now),
        and_(OpenAIUpload.status == COMPLETING, OpenAIUpload.expires_at <= stuck_before),
    )


class UploadRepository:
    def __init__(self, session: Session, owner: str):
        self.session = session
        self.owner = owner

    def _owned(self, *conditions: ColumnElement[bool]) -> ColumnElement[bool]:
        """The owner filter of every statement here, with the statement's own conditions."""
        return and_(OpenAIUpload.owner == self.owner, *conditions)

    def _ids(self, *conditions: ColumnElement[bool]) -> Select[str]:
        return select(OpenAIUpload.id).where(self._owned(*conditions))

    def _move(self, upload_id: str, to: str, *conditions: ColumnElement[bool], **values: object) -> bool:
        """The compare-and-set of an upload's status: True when this call moved it."""
        stmt = (
            update(OpenAIUpload)
            .where(self._owned(OpenAIUpload.id == upload_id, *conditions))
            .values(status=to, **values)
            .execution_options(synchronize_session=False)
        )
        return _rowcount(self.session.execute(stmt)) == 1

    def _drop_parts(self, upload_id: str) -> None:
        self.session.execute(
            delete(OpenAIUploadPart)
            .where(OpenAIUploadPart.upload_id.in_(self._ids(OpenAIUpload.id == upload_id)))
            .execution_options(synchronize_session=False)
        )

    # Reads ------------------------------------------------------------------------------------------------

    def get(self, upload_id: str) -> OpenAIUpload | None:
        return self.session.scalars(
            select(OpenAIUpload).where(self._owned(OpenAIUpload.id == upload_id))
        ).first()

    def parts(self, upload_id: str) -> list[OpenAIUploadPart]:
        stmt = (
            select(OpenAIUploadPart)
            .where(OpenAIUploadPart.upload_id.in_(self._ids(OpenAIUpload.id == upload_id)))
            .order_by(OpenAIUploadPart.seq)
        )
        return list(self.session.scalars(stmt))

    def received(self, upload_id: str) -> int:
        """The bytes of the upload's parts."""
        stmt = select(func.coalesce(func.sum(OpenAIUploadPart.bytes), 0)).where(
            OpenAIUploadPart.upload_id.in_(self._ids(OpenAIUpload.id == upload_id))
        )
        return int(self.session.scalar(stmt) or 0)

    def bytes_held(self) -> int:
        """What the parts of this owner's unfinished uploads hold, which counts in the owner's file quota
        as its files do. A pending upload past its expiry still counts until it is swept (its bytes are
        still on disk)."""
        stmt = select(func.coalesce(func.sum(OpenAIUploadPart.bytes), 0)).where(
            OpenAIUploadPart.upload_id.in_(self._ids(OpenAIUpload.status.in_(LIVE)))
        )
        return int(self.session.scalar(stmt) or 0)

    def live_ids(self, upload_ids: Iterable[str]) -> set[str]:
        """Which of these uploads are this owner's and pending or completing (their folders are kept)."""
        wanted = list(upload_ids)
        if not wanted:
            return set()
        stmt = self._ids(OpenAIUpload.id.in_(wanted), OpenAIUpload.status.in_(LIVE))
        return set(self.session.scalars(stmt))

    # Writes -----------------------------------------------------------------------------------------------

    def add(self, row: OpenAIUpload) -> None:
        if row.owner != self.owner:
            raise ValueError("an upload is added for the repository's owner only")
        self.session.add(row)
        self.session.flush()

    def hold_pending(self, upload_id: str, *, now: datetime) -> bool:
        """Lock the upload's row until the transaction ends if it is pending and not expired (a part is
        recorded under it): True when it is. A `complete` or `cancel` racing with the part waits for
        this transaction, or this one sees the upload no longer pending."""
        return self._move(upload_id, PENDING, *_open(now))

    def add_part(self, part: OpenAIUploadPart) -> None:
        self.session.add(part)
        self.session.flush()

    def claim(self, upload_id: str, *, now: datetime) -> bool:
        """pending -> completing, for one `complete` (the one this returns True to)."""
        return self._move(upload_id, COMPLETING, *_open(now))

    def release(self, upload_id: str) -> bool:
        """completing -> pending: the `complete` that claimed it made no file (its parts are kept)."""
        return self._move(upload_id, PENDING, OpenAIUpload.status == COMPLETING)

    def finish(self, upload_id: str, file_id: str) -> bool:
        """completing -> completed with the file made from it; its part rows go."""
        if not self._move(upload_id, COMPLETED, OpenAIUpload.status == COMPLETING, file_id=file_id):
            return False
        self._drop_parts(upload_id)
        return True

    def cancel(self, upload_id: str, *, now: datetime) -> bool:
        """pending (not expired) -> cancelled; its part rows go."""
        if not self._move(upload_id, CANCELLED, *_open(now)):
            return False
        self._drop_parts(upload_id)
        return True

    def expire_due(self, *, now: datetime, stuck_before: datetime) -> list[str]:
        """This owner's uploads due to expire (`_due`) made expired, their part rows gone: their ids."""
        due = list(self.session.scalars(self._ids(_due(now, stuck_before)).order_by(OpenAIUpload.seq)))
        return [upload_id for upload_id in due if self._expire(upload_id, now, stuck_before)]

    def _expire(self, upload_id: str, now: datetime, stuck_before: datetime) -> bool:
        if not self._move(upload_id, EXPIRED, _due(now, stuck_before)):
            return False
        self._drop_parts(upload_id)
        return True


# System operations ---------------------------------------------------------------------------------------


def expire_due(session: Session, *, now: datetime, stuck_before: datetime) -> list[tuple[str, str]]:
    """Every owner's uploads due to expire, made expired with their part rows gone: (owner, id) each."""
    # In one order, as the owner's sweep takes them: two sweeps never wait on each other's rows in a cycle.
    stmt = select(OpenAIUpload.owner, OpenAIUpload.id).where(_due(now, stuck_before))
    due = session.execute(stmt.order_by(OpenAIUpload.seq)).all()
    return [
        (owner, upload_id)
        for owner, upload_id in due
        if UploadRepository(session, owner)._expire(upload_id, now, stuck_before)
    ]


def live_upload_ids(session: Session, upload_ids: Iterable[str]) -> set[str]:
    """Which of these uploads (any owner's) are pending or completing."""
    wanted = list(upload_ids)
    if not wanted:
        return set()
    stmt = select(OpenAIUpload.id).where(OpenAIUpload.id.in_(wanted), OpenAIUpload.status.in_(LIVE))
    return set(session.scalars(stmt))


def sweep(session: Session, data_dir: Path, *, owner: str | None = None, now: datetime | None = None) -> int:
    """End the uploads due to expire (their rows committed as expired, their part rows gone) and remove
    the upload folders of no pending or completing upload (those just ended, those a crash left between
    a commit and the removal); `owner`: that owner's alone. Returns how many folders went."""
    now = now or utcnow()
    stuck_before = now - STUCK_AFTER
    if owner is None:
        expire_due(session, now=now, stuck_before=stuck_before)
    else:
        UploadRepository(session, owner).expire_due(now=now, stuck_before=stuck_before)
    session.commit()
    # Read after the commit: a folder is made only for an upload whose row is pending, and an upload that
    # is neither pending nor completing never becomes either again.
    on_disk = files.upload_dirs(data_dir, owner)
    live = (
        live_upload_ids(session, on_disk)
        if owner is None
        else UploadRepository(session, owner).live_ids(on_disk)
    )
    session.commit()
    removed = 0
    for upload_id, folder in on_disk.items():
        if upload_id not in live:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed
