"""Named locks between processes and threads of the service: the primitives `worker.locks` and `ftq up`'s
migration build on.

- `thread_lock(name)`: one `threading.Lock` per name in this process (PostgreSQL advisory locks and
  flock are per session / per open file, so two threads of one process would both get them).
- `flock(path)`: an exclusive file lock the kernel drops when the holder dies.
- `named_lock(name)`: held across processes and hosts: a session-level PostgreSQL advisory lock
  (`advisory_key(name)`) on PostgreSQL, a file lock in `<data dir>/locks/<name>.lock` on SQLite (the
  embedded setup is one host by construction).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import text

from ftq.runtime.settings import get_settings
from ftq.store.db import advisory_key, get_engine

_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def thread_lock(name: str) -> threading.Lock:
    with _thread_locks_guard:
        return _thread_locks.setdefault(name, threading.Lock())


def lock_path(name: str) -> Path:
    folder = get_settings().state_path("locks")
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}.lock"


@contextlib.contextmanager
def flock(path: Path, *, blocking: bool) -> Iterator[bool]:
    """Yields True with the lock held; False (without it) when `blocking` is off and it is taken."""
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


@contextlib.contextmanager
def named_lock(name: str, *, blocking: bool) -> Iterator[bool]:
    """The lock `name` across every process of this store; yields whether it is held (always True when
    `blocking`)."""
    engine = get_engine()
    if engine.dialect.name != "postgresql":
        with flock(lock_path(name), blocking=blocking) as got:
            yield got
        return
    key = {"k": advisory_key(name)}
    with engine.connect() as conn:
        if blocking:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), key)
            got = True
        else:
            got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), key).scalar())
        conn.commit()
        try:
            yield got
        finally:
            if got:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), key)
                conn.commit()
