"""Every SQL statement about Tinker (issue 52): training clients (a run of the one scheduler's that
belongs to an owner, like a deployment), the SDK's sessions, and the checkpoints they saved.

`TinkerRepository(session, owner)` is what the API uses: every read goes through the `_readable`
helpers, the one place the owner filter is applied to these tables (another owner's model, session,
sampler or checkpoint is the 404 of one that does not exist). The module-level functions are the
worker's; a training client's transitions are `TRAINING_CLIENTS`, the one compare-and-set mechanism of
every kind of run (`ftq.store.transitions.RunTable`) on this table.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select, update
from sqlalchemy.orm import Session

from ftq.contract.status import LAUNCHED, JobStatus
from ftq.store.models import TinkerCheckpoint, TinkerSession, TrainingClient
from ftq.store.repository import account_other_run
from ftq.store.transitions import RunTable, utcnow

ACTIVE = (JobStatus.queued, JobStatus.starting, JobStatus.running)


def new_session_id() -> str:
    # No colon: a model id is `<session_id>:train:<n>` and the SDK splits on it.
    return "ses_" + secrets.token_hex(8)


def device_seconds(row: Any, until: datetime | None = None) -> float:
    """Its devices x the time it has held them (launch to end, or to `until` while it runs)."""
    if row.started_at is None:
        return 0.0
    end = row.finished_at or until or utcnow()
    return float(max(0.0, (end - row.started_at).total_seconds()) * max(1, int(row.devices)))


def _ended(
    session: Session, row_id: str, *, run_started: datetime | None, run_ended: datetime | None
) -> None:
    """A training client that ran counts in its owner's usage as a job does: devices x time held."""
    row = get_training_client(session, row_id)
    if row is None:
        return
    # The row may be the session's copy from before the move (no finished_at yet): its end is now.
    start, end = run_started or row.started_at, run_ended or row.finished_at or utcnow()
    if start is None:
        return
    seconds = max(0.0, (end - start).total_seconds()) * max(1, row.devices)
    account_other_run(session, row.owner, device_seconds=seconds, cuda=row.device == "cuda")


# Its queue and cancel wake the worker through the broker directly (`ftq.runtime.queue`), as a
# deployment's do; the worker's sweep every few seconds catches a lost one.
TRAINING_CLIENTS = RunTable(TrainingClient, cancel_dispatch=None, on_ended=_ended)


class TinkerRepository:
    """An owner's training clients, sessions and checkpoints (see the module's docstring)."""

    def __init__(self, session: Session, owner: str):
        self.session = session
        self.owner = owner

    # Reads, each through the owner filter --------------------------------------------------------------

    def _clients(self) -> Select[Any]:
        return select(TrainingClient).where(TrainingClient.owner == self.owner)

    def _sessions(self) -> Select[Any]:
        return select(TinkerSession).where(TinkerSession.owner == self.owner)

    def _checkpoints(self) -> Select[Any]:
        return select(TinkerCheckpoint).where(TinkerCheckpoint.owner == self.owner)

    def client(self, model_id: str) -> TrainingClient | None:
        row: TrainingClient | None = self.session.scalars(
            self._clients().where(TrainingClient.id == model_id)
        ).first()
        return row

    def clients(self, limit: int, offset: int) -> tuple[list[TrainingClient], int]:
        """A page of the owner's training clients, newest first, and how many there are."""
        rows = self.session.scalars(
            self._clients().order_by(TrainingClient.seq.desc()).limit(limit).offset(offset)
        )
        total = self.session.scalar(
            select(func.count()).select_from(TrainingClient).where(TrainingClient.owner == self.owner)
        )
        return list(rows), int(total or 0)

    def clients_of_session(self, session_id: str) -> list[TrainingClient]:
        stmt = self._clients().where(TrainingClient.session_id == session_id)
        return list(self.session.scalars(stmt.order_by(TrainingClient.seq)))

    def get_session(self, session_id: str) -> TinkerSession | None:
        row: TinkerSession | None = self.session.scalars(
            self._sessions().where(TinkerSession.id == session_id)
        ).first()
        return row

    def checkpoint(self, path: str) -> TinkerCheckpoint | None:
        row: TinkerCheckpoint | None = self.session.scalars(
            self._checkpoints().where(TinkerCheckpoint.path == path)
        ).first()
        return row

    def checkpoints(self, model_id: str | None = None) -> list[TinkerCheckpoint]:
        """The owner's checkpoints (of one model), newest first."""
        stmt = self._checkpoints()
        if model_id is not None:
            stmt = stmt.where(TinkerCheckpoint.model_id == model_id)
        return list(self.session.scalars(stmt.order_by(TinkerCheckpoint.seq.desc())))

    # Writes ------------------------------------------------------------------------------------------

    def add_session(self, user_metadata: dict[str, Any] | None) -> TinkerSession:
        now = utcnow()
        row = TinkerSession(
            id=new_session_id(),
            owner=self.owner,
            created_at=now,
            last_heartbeat_at=now,
            user_metadata=user_metadata,
            models=0,
        )
        self.session.add(row)
        self.session.flush()
        return row

    def heartbeat(self, session_id: str) -> bool:
        result = self.session.execute(
            update(TinkerSession)
            .where(TinkerSession.owner == self.owner, TinkerSession.id == session_id)
            .values(last_heartbeat_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        return bool(getattr(result, "rowcount", 0))

    def finish_session(self, session_id: str) -> None:
        self.session.execute(
            update(TinkerSession)
            .where(TinkerSession.owner == self.owner, TinkerSession.id == session_id)
            .values(finished_at=utcnow())
            .execution_options(synchronize_session=False)
        )

    def add_client(self, model_id: str, **fields: Any) -> TrainingClient:
        """A queued training client (its worker is woken by the caller, after the commit)."""
        now = utcnow()
        row = TrainingClient(
            id=model_id,
            owner=self.owner,
            status=JobStatus.queued,
            created_at=now,
            updated_at=now,
            last_used_at=now,
            api_key=secrets.token_urlsafe(32),
            **fields,
        )
        self.session.add(row)
        self.session.flush()
        return row

    def used(self, model_id: str, endpoint: str | None = None) -> None:
        values: dict[str, Any] = {"last_used_at": utcnow()}
        if endpoint is not None:
            values["endpoint"] = endpoint
        self.session.execute(
            update(TrainingClient)
            .where(TrainingClient.owner == self.owner, TrainingClient.id == model_id)
            .values(**values)
            .execution_options(synchronize_session=False)
        )

    def request_cancel(self, model_id: str) -> str | None:
        if self.client(model_id) is None:
            return None
        return TRAINING_CLIENTS.request_cancel(self.session, model_id)

    def add_checkpoint(
        self, *, path: str, model_id: str, kind: str, name: str, folder: str, size_bytes: int | None
    ) -> TinkerCheckpoint:
        """Record a save; saving the same path again (overwrite) replaces the row's folder and time."""
        row = self.checkpoint(path)
        if row is None:
            row = TinkerCheckpoint(path=path, owner=self.owner, model_id=model_id, kind=kind, name=name)
            self.session.add(row)
        row.folder, row.size_bytes, row.created_at = folder, size_bytes, utcnow()
        self.session.flush()
        return row

    def usage_rows(
        self, since: datetime | None, until: datetime | None
    ) -> list[tuple[str, datetime, float, str]]:
        """(owner, finished_at, device_seconds, device) of this owner's training clients that ran and
        ended in [since, until)."""
        stmt = self._clients().where(
            TrainingClient.started_at.is_not(None), TrainingClient.finished_at.is_not(None)
        )
        if since is not None:
            stmt = stmt.where(TrainingClient.finished_at >= since)
        if until is not None:
            stmt = stmt.where(TrainingClient.finished_at < until)
        return [
            (r.owner, r.finished_at, device_seconds(r), r.device)
            for r in self.session.scalars(stmt)
            if r.finished_at is not None
        ]


def next_model_seq(session: Session, owner: str, session_id: str, wanted: int) -> None:
    """Remember that `wanted` was handed out in this session (the SDK numbers its models itself)."""
    session.execute(
        update(TinkerSession)
        .where(TinkerSession.owner == owner, TinkerSession.id == session_id, TinkerSession.models <= wanted)
        .values(models=wanted + 1)
        .execution_options(synchronize_session=False)
    )


# System operations (the worker, for every owner) -----------------------------------------------------


def get_training_client(session: Session, model_id: str) -> TrainingClient | None:
    row: TrainingClient | None = session.scalars(
        select(TrainingClient).where(TrainingClient.id == model_id)
    ).first()
    return row


def rows_in(session: Session, statuses: Iterable[str]) -> list[TrainingClient]:
    stmt = select(TrainingClient).where(TrainingClient.status.in_([str(s) for s in statuses]))
    return list(session.scalars(stmt.order_by(TrainingClient.seq)))


def queued_for_scheduling(session: Session) -> list[TrainingClient]:
    return rows_in(session, [JobStatus.queued])


def holding_devices(session: Session) -> list[Any]:
    """Training clients holding local devices: (id, owner, resources, started_at)."""
    stmt = select(
        TrainingClient.id, TrainingClient.owner, TrainingClient.resources, TrainingClient.started_at
    ).where(TrainingClient.status.in_([str(s) for s in LAUNCHED]), TrainingClient.resources.is_not(None))
    return [r for r in session.execute(stmt) if r.resources]


def unused_since(session: Session, before: datetime) -> list[str]:
    """Running training clients no call has used since `before`."""
    stmt = select(TrainingClient.id).where(
        TrainingClient.status == JobStatus.running, TrainingClient.last_used_at < before
    )
    return list(session.scalars(stmt))
