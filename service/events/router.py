"""HTTP routes for events: one job's (`/jobs/{id}/events`) and all of the owner's (`/events`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from ftq.contract.schemas import EventPage
from ftq.store.events import EventRepository
from ftq.store.repository import JobRepository
from service.deps import OwnerDep, SessionDep
from service.events import service
from service.routes import UNAUTHORIZED, owner_errors

router = APIRouter(tags=["events"])

_AFTER = Query(
    0, ge=0, le=2**63 - 1, description="Only events with an id above this (`next_after` of a page)."
)
_LIMIT = Query(100, ge=1, le=1000)


@router.get(
    "/jobs/{job_id}/events",
    response_model=EventPage,
    responses=owner_errors("No such job for this owner"),
    summary="A job's events, oldest first",
)
def job_events(
    job_id: Annotated[str, Path(min_length=1, max_length=64)],
    session: SessionDep,
    owner: OwnerDep,
    after: int = _AFTER,
    limit: int = _LIMIT,
) -> EventPage:
    return service.job_page(
        JobRepository(session, owner), EventRepository(session, owner), job_id, after=after, limit=limit
    )


@router.get(
    "/events",
    response_model=EventPage,
    responses={401: UNAUTHORIZED},
    summary="Events of all the owner's jobs",
)
def all_events(session: SessionDep, owner: OwnerDep, after: int = _AFTER, limit: int = _LIMIT) -> EventPage:
    return service.page(EventRepository(session, owner), after=after, limit=limit)
