"""Every SQL statement about exports.

`ExportRepository(session, owner)` is what the API uses: every read goes through `_readable()`, which
joins the export's job and filters on its owner, the one place the owner filter is applied to exports.
The module-level functions are the worker's: compare-and-set transitions along `ftq.contract.status`'s edges,
named after the transition, so a sweep or task that runs twice changes nothing the second time. They are
the job repository's own (`move_status`, `record_handle`, `ended`, `ask_to_cancel`) on this table.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from ftq.contract.status import LAUNCHED, JobStatus, sources_of
from ftq.store import repository
from ftq.store.models import Dispatch, Export, Job
from ftq.store.repository import utcnow

# The outbox's dispatch kind that wakes the worker's export sweep (`ftq.runtime.queue.TASK_EXPORTS`).
DISPATCH_KIND = "export"
# An export that is one of these is what a second identical request gets back instead of a new one.
REUSABLE = (JobStatus.queued, JobStatus.starting, JobStatus.running, JobStatus.succeeded)


def new_export_id() -> str:
    return "exp_" + secrets.token_hex(8)


class ExportRepository:
    def __init__(self, session: Session, owner: str):
        self.session = session
        self.owner = owner

    def _readable(self) -> Select[Any]:
        return select(Export).join(Job, Job.id == Export.job_id).where(Job.owner == self.owner)

    def get(self, job_id: str, export_id: str) -> Export | None:
        stmt = self._readable().where(Export.job_id == job_id, Export.id == export_id)
        return self.session.scalars(stmt).first()

    def list_for(self, job_id: str) -> list[Export]:
        """The job's exports, newest first."""
        stmt = self._readable().where(Export.job_id == job_id).order_by(Export.seq.desc())
        return list(self.session.scalars(stmt))

    def find_same(
        self, job_id: str, *, kind: str, dtype: str, max_shard_size: str, push_to_hub: dict[str, Any] | None
    ) -> Export | None:
        """The newest export of this job with the same request that is under way or has succeeded."""
        stmt = self._readable().where(
            Export.job_id == job_id,
            Export.kind == kind,
            Export.dtype == dtype,
            Export.max_shard_size == max_shard_size,
            Export.status.in_([str(s) for s in REUSABLE]),
        )
        found: list[Export] = list(self.session.scalars(stmt.order_by(Export.seq.desc())))
        return next((e for e in found if (e.push_to_hub or None) == (push_to_hub or None)), None)

    def add_with_dispatch(self, export: Export) -> Dispatch:
        """The export and the dispatch that wakes the worker, in the caller's transaction."""
        self.session.add(export)
        self.session.flush()
        dispatch = Dispatch(
            job_id=export.job_id, kind=DISPATCH_KIND, created_at=export.created_at, attempts=0
        )
        self.session.add(dispatch)
        self.session.flush()
        return dispatch


# System operations (the worker, for every owner) -----------------------------------------------------


def get_export(session: Session, export_id: str) -> Export | None:
    return session.scalars(select(Export).where(Export.id == export_id)).first()


def exports_in(session: Session, statuses: Iterable[str]) -> list[Export]:
    stmt = select(Export).where(Export.status.in_([str(s) for s in statuses]))
    return list(session.scalars(stmt.order_by(Export.seq)))


def held_resources(session: Session) -> list[dict[str, Any]]:
    """What launched exports hold of the local pool (GPUs or CPU slots)."""
    stmt = select(Export.resources).where(
        Export.status.in_([str(s) for s in LAUNCHED]), Export.resources.is_not(None)
    )
    return [r for r in session.scalars(stmt) if r]


def _cas(session: Session, export_id: str, from_: Iterable[str], to: str, **values: Any) -> bool:
    """An export's compare-and-set: the jobs' `move_status` on this table (exports record no events)."""
    return repository.move_status(session, Export, export_id, from_, to, **values)


def mark_starting(session: Session, export_id: str, *, resources: dict[str, Any] | None) -> bool:
    """queued -> starting: the worker that wins this owns the launch."""
    return _cas(session, export_id, [JobStatus.queued], JobStatus.starting, resources=resources)


def record_launch(
    session: Session, export_id: str, *, external_id: str | None, pid: int | None, pid_start_ticks: int | None
) -> bool:
    """Store the launch handle while the export may already be `cancelling`."""
    return repository.record_handle(
        session, Export, export_id, external_id=external_id, pid=pid, pid_start_ticks=pid_start_ticks
    )


def mark_running(session: Session, export_id: str) -> bool:
    return _cas(session, export_id, [JobStatus.starting], JobStatus.running, started_at=utcnow())


def requeue(session: Session, export_id: str) -> bool:
    """starting -> queued: claimed, but its worker stopped before launching it."""
    return _cas(session, export_id, [JobStatus.starting], JobStatus.queued, **repository.UNCLAIMED)


def mark_finished(
    session: Session,
    export_id: str,
    status: JobStatus,
    *,
    error_code: str | None = None,
    error_message: str | None = None,
    exit_code: int | None = None,
) -> bool:
    """-> succeeded | failed | cancelled from every state that may end so; releases held resources."""
    values = repository.ended(status, error_code=error_code, error_message=error_message, exit_code=exit_code)
    return _cas(session, export_id, sources_of(status), status, **values)


def request_cancel(session: Session, export: Export) -> str | None:
    """queued -> cancelled at once; starting/running -> cancelling (with a dispatch that wakes the
    worker). None when it was already cancelling or finished: cancel is idempotent."""
    return repository.ask_to_cancel(
        _cas, session, export.id, job_id=export.job_id, dispatch_kind=DISPATCH_KIND
    )
