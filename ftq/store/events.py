"""Every SQL statement about job events, webhooks and webhook deliveries.

`record()` is the one way an event is written: in the caller's transaction, with a delivery row (the
webhook outbox) for every enabled webhook of the job's owner that subscribes to its type, so the change,
its event and its deliveries commit together or not at all. `EventRepository` and `WebhookRepository`
are what the API reads through: their `_readable()` is the one place the owner filter is applied. The
functions after them are the worker's sender's (`worker.webhooks`).
"""

from __future__ import annotations

import builtins
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, exists, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, aliased

from ftq.contract.events import EventType
from ftq.store.db import lock_for_transaction
from ftq.store.models import Job, JobEvent, Webhook, WebhookDelivery
from ftq.store.owned import OwnedRepository

PENDING, SUCCEEDED, FAILED = "pending", "succeeded", "failed"

# Event inserts take this transaction-scoped lock on PostgreSQL, so they commit in the order of their
# ids and `?after=<id>` never skips an event that a slower transaction commits later with a smaller id.
EVENT_LOCK = "job_events"


def _now() -> datetime:
    return datetime.now(UTC)


def _dialect_insert(session: Session) -> Any:
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert


def record(
    session: Session,
    job_id: str,
    type_: EventType | str,
    data: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    owner: str | None = None,
) -> int | None:
    """Insert an event (and its webhook deliveries) in the caller's transaction; its id, or None when
    an event with this `key` was already recorded for the job (a run-directory event read again)."""
    lock_for_transaction(session, EVENT_LOCK)
    if owner is None:
        owner = session.scalar(select(Job.owner).where(Job.id == job_id))
        if owner is None:
            return None
    now = _now()
    values = {
        "job_id": job_id,
        "owner": owner,
        "type": str(type_),
        "time": now,
        "data": data or {},
        "key": key,
    }
    stmt = _dialect_insert(session)(JobEvent).values(**values)
    if key is not None:
        stmt = stmt.on_conflict_do_nothing(index_elements=[JobEvent.job_id, JobEvent.key])
    event_id = session.execute(stmt.returning(JobEvent.id)).scalar()
    if event_id is None:
        return None
    hooks = session.execute(
        select(Webhook.id, Webhook.events).where(Webhook.owner == owner, Webhook.enabled.is_(True))
    ).all()
    rows = [
        {
            "webhook_id": hook_id,
            "event_id": event_id,
            "job_id": job_id,
            "status": PENDING,
            "attempts": 0,
            "created_at": now,
            "next_attempt_at": now,
        }
        for hook_id, types in hooks
        if str(type_) in (types or [])
    ]
    if rows:
        session.execute(insert(WebhookDelivery), rows)
    return int(event_id)


def queue_position(session: Session, job_id: str) -> int | None:
    """1 for the queued job that is next to start, oldest first (as the scheduler takes them)."""
    seq = session.scalar(select(Job.seq).where(Job.id == job_id))
    if seq is None:
        return None
    ahead = session.scalar(select(func.count()).select_from(Job).where(Job.status == "queued", Job.seq < seq))
    return int(ahead or 0) + 1


def keys_with_prefix(session: Session, job_id: str, prefix: str) -> set[str]:
    stmt = select(JobEvent.key).where(
        JobEvent.job_id == job_id, JobEvent.key.startswith(prefix, autoescape=True)
    )
    return {k for k in session.scalars(stmt) if k}


# What the API reads ------------------------------------------------------------------------------------


class EventRepository(OwnedRepository):
    model = JobEvent

    def page(self, *, after: int, limit: int, job_id: str | None = None) -> list[JobEvent]:
        stmt = self._readable().where(JobEvent.id > after)
        if job_id is not None:
            stmt = stmt.where(JobEvent.job_id == job_id)
        return list(self.session.scalars(stmt.order_by(JobEvent.id).limit(limit)))


class WebhookRepository(OwnedRepository):
    model = Webhook

    def get(self, webhook_id: str) -> Webhook | None:
        return self.session.scalars(self._readable().where(Webhook.id == webhook_id)).first()

    def list(self) -> list[Webhook]:
        return list(self.session.scalars(self._readable().order_by(Webhook.created_at, Webhook.id)))

    def count(self) -> int:
        stmt = select(func.count()).select_from(Webhook).where(Webhook.owner == self.owner)
        return int(self.session.scalar(stmt) or 0)

    def add(self, *, url: str, events: Sequence[str], secret: str) -> Webhook:
        hook = Webhook(
            id="wh_" + secrets.token_hex(8),
            owner=self.owner,
            url=url,
            events=list(events),
            secret=secret,
            enabled=True,
            consecutive_failures=0,
            created_at=_now(),
        )
        self.session.add(hook)
        self.session.flush()
        return hook

    def delete(self, hook: Webhook) -> None:
        self.session.execute(delete(WebhookDelivery).where(WebhookDelivery.webhook_id == hook.id))
        self.session.delete(hook)
        self.session.flush()

    def enable(self, hook: Webhook) -> None:
        """Enabled again: the failure count starts over; what waited is due now, with a new retry window."""
        hook.enabled = True
        hook.consecutive_failures = 0
        hook.disabled_reason = None
        self.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.webhook_id == hook.id, WebhookDelivery.status == PENDING)
            .values(next_attempt_at=_now(), first_attempt_at=None)
        )
        self.session.flush()

    def deliveries(
        self, hook: Webhook, *, after: int, limit: int
    ) -> builtins.list[tuple[WebhookDelivery, str]]:
        """(delivery, event type) of one of this owner's webhooks, oldest first."""
        stmt = (
            select(WebhookDelivery, JobEvent.type)
            .join(JobEvent, JobEvent.id == WebhookDelivery.event_id)
            .where(WebhookDelivery.webhook_id == hook.id, WebhookDelivery.id > after)
            .order_by(WebhookDelivery.id)
            .limit(limit)
        )
        return [(d, str(t)) for d, t in self.session.execute(stmt).all()]


# The sender ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Due:
    """A delivery to try now, with what its request is made of."""

    delivery_id: int
    webhook_id: str
    url: str
    secret: str
    event_id: int
    event_type: str
    event_time: datetime
    job_id: str
    job_name: str
    data: dict[str, Any]
    attempts: int
    first_attempt_at: datetime | None


def webhooks_with_due(session: Session, now: datetime) -> list[tuple[str, str]]:
    """(webhook id, its owner) of every enabled webhook with a delivery due now, oldest webhook first."""
    stmt = (
        select(WebhookDelivery.webhook_id, Webhook.owner)
        .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
        .where(
            WebhookDelivery.status == PENDING,
            WebhookDelivery.next_attempt_at <= now,
            Webhook.enabled.is_(True),
        )
        .distinct()
        .order_by(WebhookDelivery.webhook_id)
    )
    return [(str(w), str(owner)) for w, owner in session.execute(stmt)]


def due_for(session: Session, webhook_id: str, now: datetime, limit: int = 50) -> list[Due]:
    """The deliveries of one enabled webhook to try now: for each job only its oldest pending one (a
    job's events go out in order: N+1 waits until N succeeded or gave up)."""
    earlier = aliased(WebhookDelivery)
    stmt = (
        select(WebhookDelivery, Webhook.url, Webhook.secret, JobEvent, Job.name)
        .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
        .join(JobEvent, JobEvent.id == WebhookDelivery.event_id)
        .join(Job, Job.id == JobEvent.job_id)
        .where(
            WebhookDelivery.webhook_id == webhook_id,
            WebhookDelivery.status == PENDING,
            WebhookDelivery.next_attempt_at <= now,
            Webhook.enabled.is_(True),
            ~exists().where(
                earlier.webhook_id == WebhookDelivery.webhook_id,
                earlier.job_id == WebhookDelivery.job_id,
                earlier.status == PENDING,
                earlier.event_id < WebhookDelivery.event_id,
            ),
        )
        .order_by(WebhookDelivery.event_id)
        .limit(limit)
    )
    return [
        Due(
            delivery_id=d.id,
            webhook_id=d.webhook_id,
            url=url,
            secret=secret,
            event_id=ev.id,
            event_type=ev.type,
            event_time=ev.time,
            job_id=ev.job_id,
            job_name=name,
            data=dict(ev.data or {}),
            attempts=d.attempts,
            first_attempt_at=d.first_attempt_at,
        )
        for d, url, secret, ev, name in session.execute(stmt).all()
    ]


def _attempted(due: Due, now: datetime, status_code: int | None, error: str | None) -> dict[str, Any]:
    return {
        "attempts": WebhookDelivery.attempts + 1,
        "last_attempt_at": now,
        "first_attempt_at": due.first_attempt_at or now,
        "last_status_code": status_code,
        "last_error": error[:1000] if error else None,
    }


def delivery_succeeded(session: Session, due: Due, now: datetime, status_code: int) -> None:
    session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == due.delivery_id, WebhookDelivery.status == PENDING)
        .values(status=SUCCEEDED, next_attempt_at=None, **_attempted(due, now, status_code, None))
    )
    session.execute(update(Webhook).where(Webhook.id == due.webhook_id).values(consecutive_failures=0))


def delivery_retry(
    session: Session, due: Due, now: datetime, status_code: int | None, error: str, retry_in: float
) -> None:
    session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == due.delivery_id, WebhookDelivery.status == PENDING)
        .values(next_attempt_at=now + timedelta(seconds=retry_in), **_attempted(due, now, status_code, error))
    )


def delivery_failed(
    session: Session, due: Due, now: datetime, status_code: int | None, error: str, *, disable_after: int
) -> bool:
    """The delivery gives up; after `disable_after` such in a row the webhook is disabled (True)."""
    session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == due.delivery_id, WebhookDelivery.status == PENDING)
        .values(status=FAILED, next_attempt_at=None, **_attempted(due, now, status_code, error))
    )
    session.execute(
        update(Webhook)
        .where(Webhook.id == due.webhook_id)
        .values(consecutive_failures=Webhook.consecutive_failures + 1)
    )
    failures = session.scalar(select(Webhook.consecutive_failures).where(Webhook.id == due.webhook_id)) or 0
    if failures >= disable_after:
        session.execute(
            update(Webhook)
            .where(Webhook.id == due.webhook_id, Webhook.enabled.is_(True))
            .values(
                enabled=False,
                disabled_reason=f"{failures} deliveries in a row failed after all their retries "
                f"(FTQ_WEBHOOK_DISABLE_AFTER_FAILURES={disable_after}); the last: {error[:300]}",
            )
        )
        return True
    return False
