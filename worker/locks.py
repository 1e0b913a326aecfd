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
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.store.db import lock_for_transaction
from ftq.store.locks import flock, lock_path, named_lock, thread_lock


def scheduler_lock(session: Session) -> contextlib.AbstractContextManager[object]:
    """Serialise resource claims. On PostgreSQL the lock lasts until `session` commits."""
    if lock_for_transaction(session, "scheduler"):
        return contextlib.nullcontext()
    return _sqlite_scheduler_lock()


@contextlib.contextmanager
def _sqlite_scheduler_lock() -> Iterator[None]:
    with thread_lock("scheduler"), flock(lock_path("scheduler"), blocking=True):
        yield


@contextlib.contextmanager
def singleton(name: str) -> Iterator[bool]:
    """Yields True when this caller is the only one running `name` now, else False (skip the work)."""
    tlock = thread_lock(f"singleton:{name}")
    if not tlock.acquire(blocking=False):
        yield False
        return
    try:
        with named_lock(name, blocking=False) as got:
            yield got
    finally:
        tlock.release()


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Held for a whole launch (blocking; launches of one job are rare and short)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with thread_lock(f"run:{run_dir}"), flock(run_dir / runs.RUN_LOCK, blocking=True):
        yield


@contextlib.contextmanager
def try_run_lock(run_dir: Path) -> Iterator[bool]:
    """True when no launch of this run is in progress anywhere (the lock was free)."""
    if not run_dir.exists():
        yield True
        return
    tlock = thread_lock(f"run:{run_dir}")
    if not tlock.acquire(blocking=False):
        yield False
        return
    try:
        with flock(run_dir / runs.RUN_LOCK, blocking=False) as got:
            yield got
    finally:
        tlock.release()
