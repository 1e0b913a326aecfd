"""Engine and sessions. One engine per process, created from the settings on first use."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from ftq.settings import get_settings


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

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
