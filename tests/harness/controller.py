"""The worker's controller inside the test process, on the store that `inprocess.use_settings` names:
job and export rows written straight into the store, as the API leaves them, and sweeps
(`worker.controller.reconcile`) until a row reaches a status."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ftq.store.models import Export, Job

# Whose every job here is.
OWNER = "t"

Row = TypeVar("Row", Job, Export)


def add_job(
    job_id: str, *, spec: dict[str, Any], plan: dict[str, Any], status: str = "queued", **values: Any
) -> None:
    """A local CPU job with this spec and plan (`values`: any other column, e.g. its claimed resources)."""
    from ftq.store.db import session_scope
    from ftq.store.repository import utcnow

    now = utcnow()
    with session_scope() as s:
        s.add(
            Job(
                id=job_id,
                name=job_id,
                owner=OWNER,
                status=status,
                spec=spec,
                plan=plan,
                launcher="local",
                device="cpu",
                created_at=now,
                updated_at=now,
                attempt=0,
                metrics_offset=0,
                **values,
            )
        )


def add_export(export_id: str, job_id: str, status: str = "queued", **values: Any) -> None:
    """A merged bf16 export of the job (`values`: any other column)."""
    from ftq.store.db import session_scope
    from ftq.store.repository import utcnow

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
                **values,
            )
        )


def get_job(job_id: str) -> Job:
    from ftq.store import repository
    from ftq.store.db import session_scope

    with session_scope() as s:
        job = repository.get_job(s, job_id)
    if job is None:
        raise AssertionError(f"no job {job_id}")
    return job


def get_export(export_id: str) -> Export:
    from ftq.store import exports
    from ftq.store.db import session_scope

    with session_scope() as s:
        export = exports.get_export(s, export_id)
    if export is None:
        raise AssertionError(f"no export {export_id}")
    return export


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
