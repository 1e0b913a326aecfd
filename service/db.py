"""Engine and sessions. One engine per process, created from the settings on first use."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from sqlalchemy import Engine, create_engine, event
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
    return create_engine(url, pool_size=20, max_overflow=20, pool_pre_ping=True, pool_recycle=1800)


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


def reset_engine_cache() -> None:
    """Tests switch databases between runs in one process."""
    if get_engine.cache_info().currsize:
        get_engine().dispose()
    get_engine.cache_clear()
    _sessionmaker.cache_clear()
