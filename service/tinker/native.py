"""ftq's own routes about Tinker training clients (issue 52), beside the SDK's `/api/v1`: a training client
is a run like a job, and is seen like one. `GET /training_clients` (the caller's, newest first: status,
devices, device time, when last used, the last step's time), `GET /training_clients/{id}/events` (its
event log: created, started, idle_saved, resumed, stopped, failed) and `GET /training_clients/{id}/logs`
(its host's log by byte offset, as a job's train.log: a line per call with its time). `ftq ls` and the
dashboard's deployments page read the first. Another owner's training client is a 404."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.schemas import LogChunk
from ftq.contract.status import TERMINAL, JobStatus
from ftq.contract.tinker import (
    TrainingClientEvent,
    TrainingClientEvents,
    TrainingClientInfo,
    TrainingClientList,
    client_folder,
)
from ftq.runtime.settings import Settings, get_settings
from ftq.store.models import TrainingClient
from ftq.store.training_clients import TinkerRepository, device_seconds
from service.deps import LoopOwnerDep, in_thread_session
from service.errors import NotFound
from service.jobs.logs import LOG_CHUNK_MAX, read_log_file
from service.jobs.reads import in_thread
from service.routes import UNAUTHORIZED, owner_errors

router = APIRouter(prefix="/training_clients", tags=["tinker"])

# The host's line for each call it answered: `tinker_host: <op> <seconds> s`.
CALL_LINE = re.compile(rb"^tinker_host: (\w+) ([0-9.]+) s$", re.MULTILINE)
TAIL_BYTES = 65536


def log_path(settings: Settings, row: TrainingClient) -> Path:
    return client_folder(settings.state_path("tinker"), row.seq) / runs.TRAIN_LOG


def last_step_seconds(path: Path) -> float | None:
    """The last forward_backward's time in the host's log (its last 64 KiB), or None."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read()
    except OSError:
        return None
    steps = [float(m.group(2)) for m in CALL_LINE.finditer(tail) if m.group(1) == b"forward_backward"]
    return steps[-1] if steps else None


def info(settings: Settings, row: TrainingClient) -> TrainingClientInfo:
    return TrainingClientInfo(
        id=row.id,
        base=row.base,
        lora_rank=row.lora_rank,
        status=row.status,
        device=row.device,
        devices=row.devices,
        launcher=row.launcher,
        error=row.error_message if row.status == JobStatus.failed else None,
        created_at=row.created_at,
        started_at=row.started_at if row.status not in (JobStatus.paused, JobStatus.queued) else None,
        finished_at=row.finished_at,
        last_used_at=row.last_used_at,
        device_seconds=round(device_seconds(row), 3),
        last_step_seconds=last_step_seconds(log_path(settings, row)),
    )


def listing(session: Session, owner: str, limit: int) -> TrainingClientList:
    settings = get_settings()
    rows = TinkerRepository(session, owner).all_clients(limit=limit)
    return TrainingClientList(data=[info(settings, r) for r in rows])


def _owned(session: Session, owner: str, model_id: str) -> TrainingClient:
    row = TinkerRepository(session, owner).client(model_id)
    if row is None:
        raise NotFound("no such training client")
    return row


@router.get(
    "",
    response_model=TrainingClientList,
    responses={401: UNAUTHORIZED},
    summary="Your Tinker training clients: status, devices, device time, last step",
)
async def list_training_clients(
    owner: LoopOwnerDep, limit: int = Query(50, ge=1, le=500)
) -> TrainingClientList:
    """The caller's training clients, newest first: each a run the scheduler places (queued, starting,
    running; `paused` while it waits saved idle for its next call; cancelled once its session closed;
    failed with why), where it runs, its devices x time, when a call last used it, and its host's last
    forward_backward time."""
    return await in_thread(in_thread_session(lambda s: listing(s, owner, limit)))


@router.get(
    "/{model_id}/events",
    response_model=TrainingClientEvents,
    responses=owner_errors("No such training client of yours"),
    summary="A training client's events",
)
async def training_client_events(
    model_id: str, owner: LoopOwnerDep, after: int = Query(0, ge=0, le=2**62)
) -> TrainingClientEvents:
    """Its event log after the cursor `after`: `training_client.created`, `.started` (a run is up),
    `.idle_saved` (its state saved, its run stopped), `.resumed` (a call brought it back), `.stopped`,
    `.failed`."""

    def read(session: Session) -> TrainingClientEvents:
        _owned(session, owner, model_id)
        found = TinkerRepository(session, owner).events(model_id, after=after)
        data = [
            TrainingClientEvent(id=e.id, model_id=e.model_id, type=e.type, time=e.time, data=e.data)
            for e in found
        ]
        return TrainingClientEvents(data=data, next_after=data[-1].id if data else after)

    return await in_thread(in_thread_session(read))


@router.get(
    "/{model_id}/logs",
    response_model=LogChunk,
    responses=owner_errors("No such training client of yours"),
    summary="A training client's log by byte offset (each call's time)",
)
async def training_client_logs(
    model_id: str,
    owner: LoopOwnerDep,
    offset: int = Query(0, ge=0, le=2**62),
    limit: int = Query(65536, ge=1, le=LOG_CHUNK_MAX),
) -> LogChunk:
    """Its host's log (all its runs, one after another), read as a job's train.log is: a line
    `tinker_host: <op> <seconds> s` for each call it answered, and the load's time at each start."""
    settings = get_settings()

    def read(session: Session) -> LogChunk:
        row = _owned(session, owner, model_id)
        terminal = JobStatus(row.status) in TERMINAL
        secrets_ = [row.api_key, *settings.secret_values()]
        return read_log_file(
            log_path(settings, row), terminal=terminal, offset=offset, limit=limit, secrets_=secrets_
        )

    return await in_thread(in_thread_session(read))
