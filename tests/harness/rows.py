"""Job and export rows written straight into the store that `inprocess.use_settings` names, as the API
leaves them, and the worker's controller run in the test process: sweeps (`worker.controller.reconcile`)
until a row reaches a status."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from ftq.store import exports, repository
from ftq.store.db import session_scope
from ftq.store.models import Deployment, Export, Job
from ftq.store.repository import utcnow

# Whose every job here is.
OWNER = "t"

Row = TypeVar("Row", Job, Export, Deployment)


def job_row(job_id: str, **columns: Any) -> Job:
    """A job's row as the API leaves one, not yet added: a queued local CPU job of OWNER with an empty
    spec, unless `columns` say otherwise."""
    now = utcnow()
    row: dict[str, Any] = {
        "name": job_id,
        "owner": OWNER,
        "status": "queued",
        "spec": {},
        "launcher": "local",
        "device": "cpu",
        "created_at": now,
        "updated_at": now,
        "attempt": 0,
        "metrics_offset": 0,
    }
    return Job(id=job_id, **(row | columns))


def training_points(steps: int) -> list[dict[str, float]]:
    """Metric points 1..steps as a training run logs them (the loss falling), for `upsert_points`."""
    return [
        {
            "step": i,
            "epoch": i / 1000,
            "loss": 3 - i * 1e-4,
            "learning_rate": 2e-4,
            "grad_norm": 1.0,
            "tokens_per_second": 5000.0,
            "time": 1.7e9 + i,
        }
        for i in range(1, steps + 1)
    ]


def add_job(job_id: str, **columns: Any) -> None:
    """Store `job_row(job_id, **columns)`."""
    with session_scope() as s:
        s.add(job_row(job_id, **columns))


def add_export(export_id: str, job_id: str, status: str = "queued", **columns: Any) -> None:
    """Store a merged bf16 export of the job (`columns`: any other value)."""
    now = utcnow()
    with session_scope() as s:
        s.add(
            Export(
                id=export_id,
                job_id=job_id,
                kind="merged",
                dtype="bf16",
                max_shard_size="5GB",
                status=status,
                created_at=now,
                updated_at=now,
                **columns,
            )
        )


def _read(get: Callable[[Session, str], Row | None], row_id: str) -> Row:
    with session_scope() as s:
        row = get(s, row_id)
    if row is None:
        raise AssertionError(f"no row {row_id}")
    return row


def get_job(job_id: str) -> Job:
    return _read(repository.get_job, job_id)


def get_export(export_id: str) -> Export:
    return _read(exports.get_export, export_id)


def sweep_until(read: Callable[[], Row], want: Iterable[str], timeout: float = 20) -> Row:
    """Sweep until `read()` (the row, read anew) has one of the statuses `want`; that row."""
    from worker import controller

    want = set(want)
    deadline = time.time() + timeout
    while time.time() < deadline:
        controller.reconcile()
        row = read()
        if row.status in want:
            return row
        time.sleep(0.1)
    row = read()
    raise AssertionError(f"{row.id}: {row.status}, wanted {sorted(want)}")
