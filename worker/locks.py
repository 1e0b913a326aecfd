"""Coordination between worker threads and worker processes: store locks and run-directory locks.

- `scheduler_lock`: held while free resources are computed and claimed, so two submits never hand
  out the same GPU. PostgreSQL: a transaction-scoped advisory lock (any number of workers, any hosts);
  SQLite: a file lock in the data directory (the embedded setup is one host by construction).
- `singleton`: a try-lock for the periodic sweeps (reconcile, ingest). When two schedulers run, or a
  sweep is still busy when the next tick comes, the second copy just skips.
- `run_lock`: a file lock in a run directory held for the whole launch. The kernel drops it when the
  holder dies, so `try_run_lock` succeeding on a `starting` job means nobody is launching it now.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.runtime.settings import get_settings
from ftq.store.db import advisory_key, get_engine, lock_for_transaction

_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _is_postgres() -> bool:
    return get_engine().dialect.name == "postgresql"


def _thread_lock(name: str) -> threading.Lock:
    with _thread_locks_guard:
        return _thread_locks.setdefault(name, threading.Lock())


def _lock_path(name: str) -> Path:
    folder = get_settings().data_path / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}.lock"


@contextlib.contextmanager
def _flock(path: Path, *, blocking: bool) -> Iterator[bool]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def scheduler_lock(session: Session) -> contextlib.AbstractContextManager[object]:
    """Serialise resource claims. On PostgreSQL the lock lasts until `session` commits."""
    if lock_for_transaction(session, "scheduler"):
        return contextlib.nullcontext()
    return _sqlite_scheduler_lock()


@contextlib.contextmanager
def _sqlite_scheduler_lock() -> Iterator[None]:
    with _thread_lock("scheduler"), _flock(_lock_path("scheduler"), blocking=True):
        yield


@contextlib.contextmanager
def singleton(name: str) -> Iterator[bool]:
    """Yields True when this caller is the only one running `name` now, else False (skip the work)."""
    tlock = _thread_lock(f"singleton:{name}")
    if not tlock.acquire(blocking=False):
        yield False
        return
    try:
        if _is_postgres():
            with get_engine().connect() as conn:
                key = {"k": advisory_key(name)}
                got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), key).scalar())
                conn.commit()
                try:
                    yield got
                finally:
                    if got:
                        conn.execute(text("SELECT pg_advisory_unlock(:k)"), key)
                        conn.commit()
        else:
            with _flock(_lock_path(name), blocking=False) as got:
                yield got
    finally:
        tlock.release()


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Held for a whole launch (blocking; launches of one job are rare and short)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with _thread_lock(f"run:{run_dir}"), _flock(run_dir / runs.RUN_LOCK, blocking=True):
        yield


@contextlib.contextmanager
def try_run_lock(run_dir: Path) -> Iterator[bool]:
    """True when no launch of this run is in progress anywhere (the lock was free)."""
    if not run_dir.exists():
        yield True
        return
    tlock = _thread_lock(f"run:{run_dir}")
    if not tlock.acquire(blocking=False):
        yield False
        return
    try:
        with _flock(run_dir / runs.RUN_LOCK, blocking=False) as got:
            yield got
    finally:
        tlock.release()
