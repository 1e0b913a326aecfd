"""Logging for the API and the worker: one format, and the job a record is about on every record.

`configure(level)` is called once per process, by the API at startup and by the Celery worker from
its `setup_logging` signal. It puts one handler on the root logger (Celery's task lines
shown at DEBUG only, see RoutineToDebug) whose lines read

    2026-01-02 03:04:05,678 INFO worker.controller [job=job_0123456789abcdef] job ... launched: ...

Code that acts on one job runs inside `job_context(job_id)` (or a function decorated `about_job`), and
every record logged there, by ftq or by a library it calls, carries that id; `-` outside any job. The
id lives in a context variable, so each thread and each asyncio task has its own.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO, ParamSpec, TypeVar

FORMAT = "%(asctime)s %(levelname)s %(name)s [job=%(job_id)s] %(message)s"
NO_JOB = "-"

# Celery's lines for each task (beat's `Sending due task`, `received`, `succeeded in 0.87s: None`): the
# periodic sweeps run every second or two and would bury what happens to jobs, and a job's own tasks say
# nothing the worker's line does not (`job ... launched: pid 23781`). DEBUG, as are beat's start and the
# consumer's connection to the broker; a task that fails is Celery's ERROR, which stays.
_ROUTINE_LOGGERS = frozenset(
    {"celery.beat", "celery.worker.strategy", "celery.app.trace", "celery.worker.consumer.connection"}
)
# kombu says this of every connection to the embedded (filesystem) broker, which has no host to supply.
_NO_HOSTNAME = "No hostname was supplied"

_job_id: ContextVar[str | None] = ContextVar("ftq_job_id", default=None)

P = ParamSpec("P")
R = TypeVar("R")


def current_job_id() -> str | None:
    return _job_id.get()


@contextmanager
def job_context(job_id: str | None) -> Iterator[None]:
    """Records logged inside carry `job_id` (None: no job, as outside)."""
    token = _job_id.set(job_id)
    try:
        yield
    finally:
        _job_id.reset(token)


def about_job(fn: Callable[P, R]) -> Callable[P, R]:
    """Run `fn` inside the job context of its first argument: a job id, or anything with an `id`."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        first = args[0] if args else None
        job_id = first if isinstance(first, str) else getattr(first, "id", None)
        with job_context(job_id if isinstance(job_id, str) else None):
            return fn(*args, **kwargs)

    return wrapper


class JobIdFilter(logging.Filter):
    """Sets `record.job_id` from the job context, unless the call gave one (`extra={"job_id": ...}`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "job_id", None) is None:
            record.job_id = _job_id.get() or NO_JOB
        return True


class RoutineToDebug(logging.Filter):
    """Demotes Celery's task lines (the sweeps' and every other task's), its broker connection line and
    kombu's hostname notice to DEBUG: shown with `--log-level DEBUG`, not at INFO. A task's failure
    (ERROR) and the lines about a job (ftq's loggers) stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.WARNING:
            return True
        routine = (record.name in _ROUTINE_LOGGERS and record.levelno == logging.INFO) or (
            record.name == "kombu.connection" and _NO_HOSTNAME in record.getMessage()
        )
        if not routine:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


class _FtqHandler(logging.StreamHandler[IO[str]]):
    """The handler `configure` installs; found again by its class, so a second call replaces it."""


def configure(level: int | str = "INFO", *, stream: IO[str] | None = None) -> logging.Handler:
    """Route every logger through one handler on the root, in FORMAT, at `level`. Safe to call again."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _FtqHandler)]:
        root.removeHandler(old)
        old.close()
    handler = _FtqHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(JobIdFilter())
    handler.addFilter(RoutineToDebug())
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
