"""The rules of the events API: a page of the owner's events after a cursor."""

from __future__ import annotations

from ftq.contract.schemas import Event, EventPage
from ftq.store.events import EventRepository
from ftq.store.repository import JobRepository
from service.errors import NotFound


def page(events: EventRepository, *, after: int, limit: int, job_id: str | None = None) -> EventPage:
    rows = events.page(after=after, limit=limit, job_id=job_id)
    data = [Event(id=e.id, job_id=e.job_id, type=e.type, time=e.time, data=e.data or {}) for e in rows]
    return EventPage(data=data, next_after=data[-1].id if data else after)


def job_page(
    jobs: JobRepository, events: EventRepository, job_id: str, *, after: int, limit: int
) -> EventPage:
    if jobs.get(job_id) is None:
        raise NotFound(f"job {job_id} not found")
    return page(events, after=after, limit=limit, job_id=job_id)
