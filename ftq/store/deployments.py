"""Every SQL statement about deployments (serving engines, issue 49): a run of the one scheduler's that
belongs to an owner, not to a job.

`DeploymentRepository(session, owner)` is what the API uses: every read goes through `_readable()`, the
one place the owner filter is applied to deployments. The module-level functions are the worker's; a
deployment's transitions are `DEPLOYMENTS`, the one compare-and-set mechanism of every kind of run
(`ftq.store.transitions.RunTable`) on this table.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from ftq.contract.status import LAUNCHED, TERMINAL, JobStatus
from ftq.store.models import Deployment, DeploymentQueue
from ftq.store.owned import OwnedRepository
from ftq.store.repository import account_other_run
from ftq.store.transitions import RunTable, utcnow

# A deployment in one of these is the owner's engine for its key: a call waits for it rather than
# asking for another.
ACTIVE = (JobStatus.queued, JobStatus.starting, JobStatus.running)
# Ended deployments the native view still shows (the newest first), so that an engine stopped for
# idleness, or one that failed, can be seen with its use and its error.
RECENT_ENDED = 10


def new_deployment_id() -> str:
    return "dep_" + secrets.token_hex(8)


def device_seconds(row: Any, until: datetime | None = None) -> float:
    """Its devices x the time it has held them (launch to end, or to `until` while it runs)."""
    if row.started_at is None:
        return 0.0
    end = row.finished_at or until or utcnow()
    return float(max(0.0, (end - row.started_at).total_seconds()) * max(1, int(row.devices)))


def _ended(
    session: Session, row_id: str, *, run_started: datetime | None, run_ended: datetime | None
) -> None:
    """A deployment that ran counts in its owner's usage (fair share, the period's GPU seconds) as a job
    does: its devices x the time it held them."""
    row = get_deployment(session, row_id)
    if row is None:
        return
    start, end = run_started or row.started_at, run_ended or row.finished_at
    if start is None or end is None:
        return
    seconds = max(0.0, (end - start).total_seconds()) * max(1, row.devices)
    account_other_run(session, row.owner, device_seconds=seconds, cuda=row.device == "cuda")


# Its cancel wakes the worker through the broker directly (`ftq.runtime.queue.TASK_DEPLOYMENTS`), as
# the outbox's dispatches are about jobs; the worker's sweep every few seconds catches a lost one.
DEPLOYMENTS = RunTable(Deployment, cancel_dispatch=None, on_ended=_ended)


class DeploymentRepository(OwnedRepository):
    """An owner's deployments (see the module's docstring)."""

    model = Deployment

    def get(self, deployment_id: str) -> Deployment | None:
        row: Deployment | None = self.session.scalars(
            self._readable().where(Deployment.id == deployment_id)
        ).first()
        return row

    def active(self, key: str) -> Deployment | None:
        """The owner's engine for `key` that is queued, starting or running, if any (the newest)."""
        stmt = self._readable().where(Deployment.key == key, Deployment.status.in_([str(s) for s in ACTIVE]))
        row: Deployment | None = self.session.scalars(stmt.order_by(Deployment.seq.desc())).first()
        return row

    def listing(self) -> list[Deployment]:
        """The owner's deployments that are not over, and the newest RECENT_ENDED that are; oldest first."""
        live = list(
            self.session.scalars(self._readable().where(Deployment.status.not_in([str(s) for s in TERMINAL])))
        )
        ended = list(
            self.session.scalars(
                self._readable()
                .where(Deployment.status.in_([str(s) for s in TERMINAL]))
                .order_by(Deployment.seq.desc())
                .limit(RECENT_ENDED)
            )
        )
        return sorted(live + ended, key=lambda r: r.seq)

    def add(self, deployment_id: str | None = None, **fields: Any) -> Deployment:
        """A queued deployment (its worker is woken by the caller, after the commit)."""
        now = utcnow()
        row = Deployment(
            id=deployment_id or new_deployment_id(),
            owner=self.owner,
            status=JobStatus.queued,
            created_at=now,
            updated_at=now,
            last_used_at=now,
            requests=0,
            prompt_tokens=0,
            completion_tokens=0,
            **fields,
        )
        self.session.add(row)
        self.session.flush()
        return row

    def queue_of(self, ids: Iterable[str]) -> dict[str, DeploymentQueue]:
        ids = list(ids)
        if not ids:
            return {}
        stmt = (
            select(DeploymentQueue)
            .join(Deployment, Deployment.id == DeploymentQueue.deployment_id)
            .where(Deployment.owner == self.owner, DeploymentQueue.deployment_id.in_(ids))
        )
        return {q.deployment_id: q for q in self.session.scalars(stmt)}

    def _update(self, deployment_id: str, **values: Any) -> None:
        self.session.execute(
            update(Deployment)
            .where(Deployment.owner == self.owner, Deployment.id == deployment_id)
            .values(**values)
            .execution_options(synchronize_session=False)
        )

    def used(self, deployment_id: str, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        """A call used it now (`requests`: one more when it answered with tokens counted)."""
        values: dict[str, Any] = {"last_used_at": utcnow()}
        if prompt_tokens or completion_tokens:
            values.update(
                requests=Deployment.requests + 1,
                prompt_tokens=Deployment.prompt_tokens + prompt_tokens,
                completion_tokens=Deployment.completion_tokens + completion_tokens,
            )
        self._update(deployment_id, **values)

    def mark_ready(self, deployment_id: str, endpoint: str) -> None:
        self._update(deployment_id, endpoint=endpoint, ready_at=utcnow())

    def add_adapter(self, row: Deployment, name: str, loaded_at: float) -> None:
        adapters = dict(row.adapters or {})
        adapters[name] = round(loaded_at, 3)
        self._update(row.id, adapters=adapters)

    def drop_adapter(self, row: Deployment, name: str) -> None:
        adapters = {k: v for k, v in (row.adapters or {}).items() if k != name}
        self._update(row.id, adapters=adapters)

    def request_cancel(self, deployment_id: str) -> str | None:
        """Stop it: a queued one is cancelled at once, a launched one goes `cancelling` (the caller wakes
        the worker). The new status, or None when it was already stopping or over."""
        if self.get(deployment_id) is None:
            return None
        return DEPLOYMENTS.request_cancel(self.session, deployment_id)

    def totals(self) -> tuple[datetime | None, int, int, int]:
        """(first asked for, requests, tokens in, tokens out) over all the owner's deployments."""
        row = self.session.execute(
            select(
                func.min(Deployment.created_at),
                func.coalesce(func.sum(Deployment.requests), 0),
                func.coalesce(func.sum(Deployment.prompt_tokens), 0),
                func.coalesce(func.sum(Deployment.completion_tokens), 0),
            ).where(Deployment.owner == self.owner)
        ).one()
        return row[0], int(row[1]), int(row[2]), int(row[3])

    def usage_rows(
        self, since: datetime | None, until: datetime | None
    ) -> list[tuple[str, datetime, float, str, int, int]]:
        """(owner, finished_at, device_seconds, device, tokens in, tokens out) of this owner's deployments
        that ran and ended in [since, until)."""
        stmt = self._readable().where(Deployment.started_at.is_not(None), Deployment.finished_at.is_not(None))
        if since is not None:
            stmt = stmt.where(Deployment.finished_at >= since)
        if until is not None:
            stmt = stmt.where(Deployment.finished_at < until)
        return [
            (r.owner, r.finished_at, device_seconds(r), r.device, r.prompt_tokens, r.completion_tokens)
            for r in self.session.scalars(stmt)
            if r.finished_at is not None
        ]


# System operations (the worker, for every owner) -----------------------------------------------------


def get_deployment(session: Session, deployment_id: str) -> Deployment | None:
    row: Deployment | None = session.scalars(select(Deployment).where(Deployment.id == deployment_id)).first()
    return row


def rows_in(session: Session, statuses: Iterable[str]) -> list[Deployment]:
    stmt = select(Deployment).where(Deployment.status.in_([str(s) for s in statuses]))
    return list(session.scalars(stmt.order_by(Deployment.seq)))


def queued_for_scheduling(session: Session) -> list[Deployment]:
    return rows_in(session, [JobStatus.queued])


def holding_devices(session: Session) -> list[Any]:
    """Deployments holding local devices: (id, owner, resources, started_at)."""
    stmt = select(Deployment.id, Deployment.owner, Deployment.resources, Deployment.started_at).where(
        Deployment.status.in_([str(s) for s in LAUNCHED]), Deployment.resources.is_not(None)
    )
    return [r for r in session.execute(stmt) if r.resources]


def unused_since(session: Session, before: datetime) -> list[str]:
    """Running deployments no call has used since `before` (the worker's stop of engines whose API is
    gone: the API stops its own idle ones first)."""
    stmt = select(Deployment.id).where(
        Deployment.status == JobStatus.running, Deployment.last_used_at < before
    )
    return list(session.scalars(stmt))


def idle_backstop(idle_seconds: float) -> timedelta:
    """How long past FTQ_SERVE_IDLE_SECONDS the worker waits before it stops an unused engine itself."""
    return timedelta(seconds=2 * idle_seconds + 60)
