"""The worker's logging (worker/celery_app.py through ftq.runtime.logs): the periodic sweeps' task lines are
DEBUG,
so `ftq up` at INFO prints what happens to jobs and not three lines a second."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from ftq.runtime import logs
from ftq.runtime.queue import TASK_INGEST, TASK_RECONCILE, TASK_RELAY, TASK_WEBHOOKS


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


def test_the_sweeps_named_are_the_queues_sweeps() -> None:
    assert set(logs.SWEEP_TASKS) == {TASK_INGEST, TASK_RECONCILE, TASK_RELAY, TASK_WEBHOOKS}


def _celery_lines() -> None:
    logging.getLogger("celery.beat").info("Scheduler: Sending due task %s (%s)", "ingest", "ftq.ingest")
    logging.getLogger("celery.worker.strategy").info("Task ftq.reconcile[1b2c] received")
    logging.getLogger("celery.app.trace").info("Task ftq.relay[3d4e] succeeded in 0.01s: None")
    logging.getLogger("kombu.connection").warning("No hostname was supplied. Reverting to 'localhost'")
    logging.getLogger("celery.worker.strategy").info("Task ftq.submit[5f6a] received")
    logging.getLogger("celery.app.trace").error("Task ftq.ingest[7b8c] raised unexpected: OSError()")


def test_sweeps_are_debug_and_jobs_and_failures_stay(
    root_handler: tuple[logging.Handler, io.StringIO],
) -> None:
    _, out = root_handler
    _celery_lines()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert "INFO celery.worker.strategy" in lines[0] and "ftq.submit" in lines[0]
    assert "ERROR celery.app.trace" in lines[1] and "ftq.ingest" in lines[1]


def test_at_debug_the_sweeps_show_as_debug(root_handler: tuple[logging.Handler, io.StringIO]) -> None:
    _, out = root_handler
    logging.getLogger().setLevel(logging.DEBUG)
    _celery_lines()
    lines = out.getvalue().splitlines()
    assert len(lines) == 6, lines
    assert sum(" DEBUG " in line for line in lines) == 4
