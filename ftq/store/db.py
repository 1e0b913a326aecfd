"""Engine and sessions. One engine per process, created from the settings on first use."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import stat
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

from ftq.runtime.settings import Settings, get_settings

log = logging.getLogger(__name__)
T = TypeVar("T")


# How long a SQLite statement waits for another connection's write lock before "database is locked".
SQLITE_BUSY_TIMEOUT_S = 30


def _use_wal(cur: Any) -> None:
    """Put the SQLite store in WAL mode, unless it is in it already (every store after its first
    connection). SQLite refuses the switch at once, without the busy timeout's wait, while another
    connection holds the write lock ("database is locked"): two connections opening a new store together
    both try it, and the one that loses waits for the other's switch (or its write) to end."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return  # whatever it answers: a store that cannot be in WAL is not waited for
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        # A pool as large as PostgreSQL's: the API runs up to 16 read hops at once, and a connection
        # beyond the pool is opened (with its PRAGMAs) and closed again for each one.
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
            pool_size=20,
            max_overflow=20,
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
            # WAL lets the API read while the worker writes; foreign keys are off by default in SQLite.
            # (The busy timeout is the connection's own, set by sqlite3.connect's `timeout`.)
            cur = dbapi_conn.cursor()
            _use_wal(cur)
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    engine = create_engine(url, pool_size=20, max_overflow=20, pool_recycle=1800)
    _ping_when_idle(engine)
    return engine


PING_AFTER_IDLE_SECONDS = 10.0


def _ping_when_idle(engine: Engine) -> None:
    """pool_pre_ping, but only for a connection that sat idle: a ping on every checkout would add a
    round trip to every metrics poll, and an idle connection is the one a server restart leaves stale.
    A connection that breaks while busy (the database restarted under load) fails that one statement
    (a 503 to the client), and SQLAlchemy then renews the whole pool."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: DBAPIConnection, record: ConnectionPoolEntry) -> None:
        record.info["ftq_checked_in"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(
        dbapi_conn: DBAPIConnection, record: ConnectionPoolEntry, _proxy: PoolProxiedConnection
    ) -> None:
        since = record.info.get("ftq_checked_in")
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_SECONDS:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError("stale pooled connection") from exc
        if not alive:
            raise DisconnectionError("stale pooled connection")


# The data dir holds the store, the embedded broker and every run: the service's user's alone. With run
# users (FTQ_RUN_AS_USER) it and runs/ may be entered but not listed, so a run reaches its own run
# directory by its path and nothing else (each run directory has its own mode: worker.launchers.local).
DATA_DIR_MODE = 0o700
DATA_DIR_MODE_WITH_RUN_USERS = 0o711


def ensure_data_dir(settings: Settings) -> None:
    """Create the data dir and runs/ owner-only, and take back what an older ftq left world-readable
    (the SQLite file with its WAL, made 0644 under the default umask). A process without run users (an
    `ftq api` beside a worker that has them) keeps the search bits it finds: it must not lock the runs
    out of their directories, and search alone lists and reads nothing."""
    for folder in (settings.data_path, settings.runs_dir):
        folder.mkdir(mode=DATA_DIR_MODE, parents=True, exist_ok=True)
        current = stat.S_IMODE(folder.stat().st_mode)
        mode = DATA_DIR_MODE_WITH_RUN_USERS if settings.run_users else current & DATA_DIR_MODE_WITH_RUN_USERS
        if mode == current:
            continue
        try:
            folder.chmod(mode)
        except PermissionError:
            log.warning("%s is not this user's: its mode is left as it is", folder)
    if not settings.database_url:
        _create_owner_only(settings.state_path("ftq.db"))
    for path in settings.data_path.glob("ftq.db*"):
        with contextlib.suppress(OSError):
            path.chmod(0o600)


def _create_owner_only(path: Path) -> None:
    # Before SQLite does, with its default 0644; it creates the -wal and -shm files with this file's mode.
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))


@lru_cache
def get_engine() -> Engine:
    settings = get_settings()
    if settings.sqlalchemy_url.startswith("sqlite"):
        ensure_data_dir(settings)
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

    At most `size` connections, each used by one poll at a time. A poll only reads, so one that finds
    its connection broken (the database restarted) is retried once on a new connection; if that fails
    too, the driver's error reaches the API's 503 handler. A poll cancelled mid-query (the server
    shutting down, a client gone) closes its connection, whose state is then unknown.
    """

    def __init__(self, connect_kwargs: dict[str, Any], size: int = 8):
        self._kwargs = connect_kwargs
        self._size = size
        self._slots = asyncio.Semaphore(size)
        self._idle: list[Any] = []
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    async def run(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        import psycopg

        for attempt in (1, 2):
            async with self._slots:
                conn = self._idle.pop() if self._idle else await self._connect()
                try:
                    result = await fn(conn)
                except psycopg.Error as exc:
                    if not (conn.broken or conn.closed or isinstance(exc, psycopg.OperationalError)):
                        self._put_back(conn)
                        raise
                    # The server went away (restart, terminated backends): the idle connections went
                    # with it, so none of them is handed out again.
                    for c in [conn, *self._idle]:
                        self._close_soon(c)
                    self._idle.clear()
                    if attempt == 2:
                        raise
                    continue
                except BaseException:
                    self._close_soon(conn)
                    raise
                self._put_back(conn)
                return result
        raise AssertionError("unreachable")

    async def _connect(self) -> Any:
        import psycopg

        return await psycopg.AsyncConnection.connect(**self._kwargs, autocommit=True)

    def _put_back(self, conn: Any) -> None:
        if self._closed:
            self._close_soon(conn)
        else:
            self._idle.append(conn)

    def _close_soon(self, conn: Any) -> None:
        # Not awaited where it is called: a cancelled poll must not wait, and nothing waits for a close.
        task = asyncio.get_running_loop().create_task(self._close_quietly(conn))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close_quietly(conn: Any) -> None:
        with contextlib.suppress(Exception):
            await conn.close()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await self._close_quietly(conn)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


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


def advisory_key(name: str) -> int:
    """A stable 31-bit PostgreSQL advisory-lock key for the lock `name` ("ftq:" keeps clear of other
    applications' keys)."""
    return zlib.crc32(f"ftq:{name}".encode()) & 0x7FFFFFFF


def lock_for_transaction(session: Session, name: str) -> bool:
    """On PostgreSQL, take the advisory lock `name` until `session`'s transaction ends, and say True;
    elsewhere False, and the caller serialises its own way."""
    if session.get_bind().dialect.name != "postgresql":
        return False
    session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": advisory_key(name)})
    return True
