"""Typed FastAPI dependencies: settings, a session per request, and the calling owner."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from ftq.runtime.settings import Settings, get_settings
from ftq.store.db import new_session
from ftq.store.repository import JobRepository
from service.errors import Unauthorized

ANONYMOUS_OWNER = "local"


def get_session() -> Iterator[Session]:
    session = new_session()
    try:
        yield session
    finally:
        session.close()


def current_owner(request: Request, settings: Annotated[Settings, Depends(get_settings)]) -> str:
    return owner_of(request.headers.get("authorization", ""), settings)


def owner_of(authorization: str, settings: Settings) -> str:
    """The owner an Authorization header value names (the anonymous owner with auth off); 401 otherwise."""
    if not settings.auth_enabled:
        return ANONYMOUS_OWNER
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized()
    owner = settings.owner_for_token(token.strip())
    if owner is None:
        raise Unauthorized()
    return owner


async def current_owner_on_loop(request: Request) -> str:
    """current_owner for async routes. It is pure CPU (a header and constant-time compares); declared
    async, it runs on the event loop instead of costing the two thread-pool hops FastAPI makes for sync
    dependencies."""
    return current_owner(request, get_settings())


T = TypeVar("T")


def in_thread_session(fn: Callable[[Session], T]) -> Callable[[], T]:
    """`fn` with a session of its own, closed after, for async routes to run in a worker thread
    (`anyio.to_thread.run_sync(in_thread_session(fn))`)."""

    def run() -> T:
        session = new_session()
        try:
            return fn(session)
        finally:
            session.close()

    return run


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
OwnerDep = Annotated[str, Depends(current_owner)]
LoopOwnerDep = Annotated[str, Depends(current_owner_on_loop)]


def job_repository(session: SessionDep, owner: OwnerDep) -> JobRepository:
    return JobRepository(session, owner)


RepoDep = Annotated[JobRepository, Depends(job_repository)]
