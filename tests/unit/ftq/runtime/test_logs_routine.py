"""The worker's logging (worker/celery_app.py through ftq.runtime.logs): Celery's task lines are DEBUG (the
periodic sweeps' and a job's own tasks'), so `ftq up` at INFO prints what happens to jobs and not three
lines a second, nor two Celery lines beside each of the worker's."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from ftq.runtime import logs


@pytest.fixture
def root_handler() -> Iterator[tuple[logging.Handler, io.StringIO]]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    out = io.StringIO()
    handler = logs.configure("INFO", stream=out)
    yield handler, out
    root.removeHandler(handler)
    root.setLevel(level)
    for h in handlers:
        if h not in root.handlers:
            root.addHandler(h)


def _celery_lines() -> None:
    logging.getLogger("celery.beat").info("Scheduler: Sending due task %s (%s)", "ingest", "ftq.ingest")
    logging.getLogger("celery.worker.strategy").info("Task ftq.reconcile[1b2c] received")
    logging.getLogger("celery.app.trace").info("Task ftq.relay[3d4e] succeeded in 0.01s: None")
    logging.getLogger("kombu.connection").warning("No hostname was supplied. Reverting to 'localhost'")
    logging.getLogger("celery.worker.strategy").info("Task ftq.submit[5f6a] received")
    logging.getLogger("celery.app.trace").info("Task ftq.submit[5f6a] succeeded in 0.87s: None")
    logging.getLogger("celery.worker.consumer.connection").info("Connected to fsbroker://localhost//")
    logging.getLogger("worker.lifecycle").info("job job_1 launched: pid 23781")
    logging.getLogger("celery.app.trace").error("Task ftq.ingest[7b8c] raised unexpected: OSError()")


def test_task_lines_are_debug_and_jobs_and_failures_stay(
    root_handler: tuple[logging.Handler, io.StringIO],
) -> None:
    _, out = root_handler
    _celery_lines()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert "INFO worker.lifecycle" in lines[0] and "launched: pid 23781" in lines[0]
    assert "ERROR celery.app.trace" in lines[1] and "ftq.ingest" in lines[1]


def test_at_debug_the_sweeps_show_as_debug(root_handler: tuple[logging.Handler, io.StringIO]) -> None:
    _, out = root_handler
    logging.getLogger().setLevel(logging.DEBUG)
    _celery_lines()
    lines = out.getvalue().splitlines()
    assert len(lines) == 9, lines
    assert sum(" DEBUG " in line for line in lines) == 7


def test_the_workers_lines_say_launches_and_ends_in_words() -> None:
    from worker.launchers.base import LaunchHandle, RunPhase, RunState

    # `job ... launched: %s` and `job ... ended: %s` (worker/lifecycle.py), not the dataclasses' reprs.
    assert str(LaunchHandle(pid=23781, pid_start_ticks=241400)) == "pid 23781"
    assert str(LaunchHandle(external_id="812")) == "SLURM job 812"
    assert str(RunState(RunPhase.exited, exit_code=0)) == "exited, exit code 0"
    assert str(RunState(RunPhase.exited, signal=9, reason="TIMEOUT", requeued=True)) == (
        "exited, signal 9, TIMEOUT, requeued"
    )
    assert str(RunState(RunPhase.pending, pending_reason="Priority")) == "pending (Priority)"
