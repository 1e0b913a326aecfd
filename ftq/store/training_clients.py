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

from sqlalchemy import Select, func, insert, select, update
from sqlalchemy.orm import Session

from ftq.contract.status import LAUNCHED, TERMINAL, JobStatus
from ftq.contract.tinker import TrainingClientEventType as Ev
from ftq.store.models import TinkerCheckpoint, TinkerSession, TrainingClient, TrainingClientEvent
from ftq.store.repository import account_other_run
from ftq.store.transitions import RunTable, utcnow

ACTIVE = (JobStatus.queued, JobStatus.starting, JobStatus.running)


def new_session_id() -> str:
    # No colon: a model id is `<session_id>:train:<n>` and the SDK splits on it.
    return "ses_" + secrets.token_hex(8)


def device_seconds(row: Any, until: datetime | None = None) -> float:
    """Its devices x the time it has held them: its earlier runs (each ended when it was saved idle), and
    this one's launch to end (or to `until` while it runs; nothing while it waits paused or queued)."""
    earlier = float(getattr(row, "earlier_device_seconds", None) or 0.0)
    if row.started_at is None or row.status in (JobStatus.paused, JobStatus.queued):
        return earlier
    end = row.finished_at or until or utcnow()
    return earlier + float(max(0.0, (end - row.started_at).total_seconds()) * max(1, int(row.devices)))


def record_event(
    session: Session,
    model_id: str,
    type_: str,
    data: dict[str, Any] | None = None,
    *,
    owner: str | None = None,
) -> None:
    """One event of a training client's log, in the caller's transaction."""
    if owner is None:
        owner = session.scalar(select(TrainingClient.owner).where(TrainingClient.id == model_id))
        if owner is None:
            return
    session.execute(
        insert(TrainingClientEvent).values(
            model_id=model_id, owner=owner, type=str(type_), time=utcnow(), data=data or {}
        )
    )


_EVENT_OF = {
    JobStatus.running: Ev.started,
    JobStatus.paused: Ev.idle_saved,
    JobStatus.cancelled: Ev.stopped,
    JobStatus.succeeded: Ev.stopped,
    JobStatus.failed: Ev.failed,
}


def _moved(
    session: Session, row_id: str, to: JobStatus, values: dict[str, Any], /, *, reason: str | None
) -> None:
    """A training client's status events, written with the move (ftq.contract.tinker's event types)."""
    type_ = _EVENT_OF.get(to)
    if to == JobStatus.queued and reason == RESUMED:
        type_ = Ev.resumed
    if type_ is None:
        return
    data: dict[str, Any] = {"status": str(to)}
    if to in TERMINAL and values.get("error_code"):
        data["error"] = {"code": values.get("error_code"), "message": values.get("error_message")}
    if reason:
        data["reason"] = reason
    record_event(session, row_id, type_, data)


def _ended(
    session: Session, row_id: str, *, run_started: datetime | None, run_ended: datetime | None
) -> None:
    """A training client that ran counts in its owner's usage as a job does: devices x time held."""
    row = get_training_client(session, row_id)
    if row is None:
        return
    # A row cancelled while it waited saved idle has no start: its runs were counted as they ended.
    # The row may be the session's copy from before the move (no finished_at yet): its end is now.
    start, end = run_started or row.started_at, run_ended or row.finished_at or utcnow()
    if start is None:
        return
    seconds = max(0.0, (end - start).total_seconds()) * max(1, row.devices)
    account_other_run(session, row.owner, device_seconds=seconds, cuda=row.device == "cuda")


# Its queue and cancel wake the worker through the broker directly (`ftq.runtime.queue`), as a
# deployment's do; the worker's sweep every few seconds catches a lost one.
TRAINING_CLIENTS = RunTable(TrainingClient, cancel_dispatch=None, on_moved=_moved, on_ended=_ended)
RESUMED = "its next call came after it was saved idle"
IDLE = "idle: its state was saved and its devices freed"


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
        created = {"base": row.base, "rank": row.lora_rank}
        record_event(self.session, model_id, Ev.created, created, owner=self.owner)
        return row

    def events(self, model_id: str, after: int = 0, limit: int = 200) -> list[TrainingClientEvent]:
        stmt = (
            select(TrainingClientEvent)
            .where(
                TrainingClientEvent.owner == self.owner,
                TrainingClientEvent.model_id == model_id,
                TrainingClientEvent.id > after,
            )
            .order_by(TrainingClientEvent.id)
            .limit(limit)
        )
        return list(self.session.scalars(stmt))

    def all_clients(self, statuses: Iterable[str] | None = None, limit: int = 200) -> list[TrainingClient]:
        stmt = self._clients()
        if statuses is not None:
            stmt = stmt.where(TrainingClient.status.in_([str(s) for s in statuses]))
        return list(self.session.scalars(stmt.order_by(TrainingClient.seq.desc()).limit(limit)))

    def resume_idle(self, model_id: str) -> bool:
        """paused (saved idle) -> queued: a new run of the row that loads the saved state (the caller wakes
        the worker after the commit). False when it is not waiting so."""
        row = self.client(model_id)
        if row is None or row.status != JobStatus.paused or not row.idle_state:
            return False
        config = dict(row.config)
        config["load"] = {"folder": row.idle_state, "optimizer": True, "grads": True, "path": None}
        return TRAINING_CLIENTS.move(
            self.session, model_id, [JobStatus.paused], JobStatus.queued, reason=RESUMED, config=config,
            idle_state=None, endpoint=None,
        )  # fmt: skip

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
            (TrainingClient.started_at.is_not(None)) | (TrainingClient.earlier_device_seconds.is_not(None)),
            TrainingClient.finished_at.is_not(None),
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


def unused_since(session: Session, before: datetime, *, answered: bool = False) -> list[str]:
    """Running training clients no call has used since `before` (and not being saved idle already).
    `answered`: only those whose host has answered the API (not still loading its base)."""
    stmt = select(TrainingClient.id).where(
        TrainingClient.status == JobStatus.running,
        TrainingClient.last_used_at < before,
        TrainingClient.started_at < before,  # its run (a new one, after an idle save) started before that
        TrainingClient.idle_state.is_(None),
    )
    if answered:
        stmt = stmt.where(TrainingClient.endpoint.is_not(None))
    return list(session.scalars(stmt))


def mark_idle_saved(session: Session, model_id: str, folder: str) -> bool:
    """Its state is saved in `folder`: the worker stops its run and records it paused (`held`)."""
    stmt = (
        update(TrainingClient)
        .where(TrainingClient.id == model_id, TrainingClient.status == JobStatus.running)
        .values(idle_state=folder, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(session.execute(stmt), "rowcount", 0))


def idle_saved_running(session: Session) -> list[str]:
    """Running ones whose state was saved idle: their runs are to stop."""
    stmt = select(TrainingClient.id).where(
        TrainingClient.status.in_([str(s) for s in LAUNCHED]), TrainingClient.idle_state.is_not(None)
    )
    return list(session.scalars(stmt))


def mark_paused_idle(session: Session, model_id: str, *, run_ended: datetime | None) -> bool:
    """running -> paused once the run of one saved idle has ended: its devices go back, this run's
    devices x time count in its owner's usage now (and in the row's `earlier_device_seconds`)."""
    row = get_training_client(session, model_id)
    if row is None or row.idle_state is None:
        return False
    start, end = row.started_at, run_ended or utcnow()
    seconds = max(0.0, (end - start).total_seconds()) * max(1, row.devices) if start is not None else 0.0
    moved = TRAINING_CLIENTS.mark_paused(
        session, model_id, reason=IDLE,
        earlier_device_seconds=float(row.earlier_device_seconds or 0.0) + seconds, started_at=None,
    )  # fmt: skip
    if moved and seconds:
        account_other_run(session, row.owner, device_seconds=seconds, cuda=row.device == "cuda")
    return moved
