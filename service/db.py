"""Engine and sessions. One engine per process, created from the settings on first use."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from ftq.settings import get_settings

T = TypeVar("T")


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        # A pool as large as PostgreSQL's: at SQLAlchemy's default of 5 (+10 overflow), the API's 16
        # concurrent read hops opened and closed a connection (and its PRAGMAs) on most polls.
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=20, max_overflow=20
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            # WAL lets the API read while the worker writes; foreign keys are off by default in SQLite.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    engine = create_engine(url, pool_size=20, max_overflow=20, pool_recycle=1800)
    _ping_when_idle(engine)
    return engine


PING_AFTER_IDLE_SECONDS = 10.0


def _ping_when_idle(engine: Engine) -> None:
    """pool_pre_ping, but only for a connection that sat idle: a ping on every checkout was a third of
    the metrics poll's round trips. A connection that breaks while busy (the database restarted under
    load) fails that one statement (a 503 to the client), and SQLAlchemy then renews the whole pool."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn, record):  # type: ignore[no-untyped-def]
        record.info["ftq_checked_in"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn, record, _proxy):  # type: ignore[no-untyped-def]
        since = record.info.get("ftq_checked_in")
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_SECONDS:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError("stale pooled connection") from exc
        if not alive:
            raise DisconnectionError("stale pooled connection")


@lru_cache
def get_engine() -> Engine:
    settings = get_settings()
    if settings.sqlalchemy_url.startswith("sqlite"):
        settings.data_path.mkdir(parents=True, exist_ok=True)
    return make_engine(settings.sqlalchemy_url)


@lru_cache
def _sessionmaker() -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


@contextmanager
def session_scope() -> Iterator[Session]:
    """A session that commits on success and rolls back on error (worker tasks, CLI)."""
    session = _sessionmaker()()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def new_session() -> Session:
    return _sessionmaker()()


@contextmanager
def read_session() -> Iterator[Session]:
    """A session for polls that only read: each statement commits on its own (autocommit), which saves
    the BEGIN and ROLLBACK round trips a transaction would add to every request."""
    with get_engine().connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        with Session(bind=conn) as session:
            yield session


def reset_engine_cache() -> None:
    """Tests switch databases between runs in one process."""
    if get_engine.cache_info().currsize:
        get_engine().dispose()
    get_engine.cache_clear()
    _sessionmaker.cache_clear()


# Reads on the event loop (PostgreSQL) ---------------------------------------------------------------


READ_POOL_APPLICATION_NAME = "ftq-api-reads"  # what pg_stat_activity shows for its connections


class AsyncReadPool:
    """A few autocommit psycopg AsyncConnections for the polls every dashboard repeats, used on the event
    loop: a thread-pool hop per poll cost CPU and, waiting for the GIL behind the loop, put up to tens
    of milliseconds on the tail (p99 88 ms at half load against 6 ms for /healthz).

    A poll only reads, so one that finds its connection broken (the database restarted) is retried once
    on a new connection; if that fails too, the driver's error reaches the API's 503 handler.
    """

    def __init__(self, connect_kwargs: dict[str, Any], size: int = 8):
        self._kwargs = connect_kwargs
        self._size = size
        self._idle: list[Any] = []
        self._opened = 0
        self._free = asyncio.Condition()
        self._closed = False

    async def run(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        import psycopg

        for attempt in (1, 2):
            conn = await self._acquire()
            try:
                result = await fn(conn)
            except psycopg.Error as exc:
                if conn.broken or conn.closed or isinstance(exc, psycopg.OperationalError):
                    # The server went away (restart, terminated backends): its other idle connections
                    # went with it, so none of them is handed out again.
                    await self._discard(conn, with_idle=True)
                    if attempt == 1:
                        continue
                else:
                    await self._release(conn)
                raise
            await self._release(conn)
            return result
        raise AssertionError("unreachable")

    async def _acquire(self) -> Any:
        import psycopg

        async with self._free:
            while not self._idle and self._opened >= self._size:
                await self._free.wait()
            if self._idle:
                return self._idle.pop()
            self._opened += 1
        try:
            return await psycopg.AsyncConnection.connect(**self._kwargs, autocommit=True)
        except BaseException:
            async with self._free:
                self._opened -= 1
                self._free.notify()
            raise

    async def _release(self, conn: Any) -> None:
        async with self._free:
            if self._closed:
                await conn.close()
                self._opened -= 1
            else:
                self._idle.append(conn)
            self._free.notify()

    async def _discard(self, conn: Any, *, with_idle: bool = False) -> None:
        async with self._free:
            gone = [conn]
            if with_idle:
                gone += self._idle
                self._idle = []
            self._opened -= len(gone)
            self._free.notify_all()
        for c in gone:
            await c.close()

    async def close(self) -> None:
        async with self._free:
            self._closed = True
            idle, self._idle = self._idle, []
            self._opened -= len(idle)
        for conn in idle:
            await conn.close()


def open_async_read_pool() -> AsyncReadPool | None:
    """A read pool for the configured PostgreSQL store, or None for SQLite (whose reads stay in
    threads). The API opens one in its lifespan, on its event loop, and closes it at shutdown; its
    connections are opened on first use."""
    engine = get_engine()
    if engine.dialect.name != "postgresql":
        return None
    _args, kwargs = engine.dialect.create_connect_args(engine.url)
    kwargs.setdefault("connect_timeout", 5)
    kwargs.setdefault("application_name", READ_POOL_APPLICATION_NAME)
    return AsyncReadPool(dict(kwargs))
