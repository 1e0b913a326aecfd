"""ftq.runtime.logs: one format for the API and the worker, with the job id on every record about a job."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient

from ftq.runtime import logs

log = logging.getLogger("ftq.test_logs")


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """configure() writing into a buffer; the root logger restored afterwards."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    out = io.StringIO()
    logs.configure("INFO", stream=out)
    yield out
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


def test_a_record_inside_the_job_context_carries_the_id(captured: io.StringIO) -> None:
    records: list[logging.LogRecord] = []
    keep = logging.Handler()
    keep.emit = records.append  # type: ignore[method-assign, assignment]
    keep.addFilter(logs.JobIdFilter())
    log.addHandler(keep)
    try:
        with logs.job_context("job_0123456789abcdef"):
            log.info("launched")
        log.info("swept")
    finally:
        log.removeHandler(keep)

    assert [getattr(r, "job_id", None) for r in records] == ["job_0123456789abcdef", logs.NO_JOB]
    first, second = captured.getvalue().splitlines()
    assert first.endswith(" INFO ftq.test_logs [job=job_0123456789abcdef] launched")
    assert second.endswith(" INFO ftq.test_logs [job=-] swept")


def test_configure_twice_keeps_one_handler(captured: io.StringIO) -> None:
    out = io.StringIO()
    logs.configure("WARNING", stream=out)
    log.warning("once")
    assert out.getvalue().count("once") == 1
    assert captured.getvalue() == ""
    assert logging.getLogger().level == logging.WARNING


def test_an_explicit_job_id_wins(captured: io.StringIO) -> None:
    log.error("reconciling failed", extra={"job_id": "job_b"})
    assert "[job=job_b] reconciling failed" in captured.getvalue()


@dataclass
class _View:
    id: str


def test_about_job_takes_the_id_from_the_first_argument(captured: io.StringIO) -> None:
    @logs.about_job
    def launch(job_id: str) -> str | None:
        log.info("launch")
        return logs.current_job_id()

    @logs.about_job
    def finish(v: _View, code: int) -> str | None:
        log.info("finish %s", code)
        return logs.current_job_id()

    assert launch("job_a") == "job_a"
    assert finish(_View("job_b"), 0) == "job_b"
    assert logs.current_job_id() is None
    assert "[job=job_a] launch" in captured.getvalue()
    assert "[job=job_b] finish 0" in captured.getvalue()


def test_each_thread_has_its_own_job(captured: io.StringIO) -> None:
    seen: dict[str, str | None] = {}
    inside = threading.Event()
    done = threading.Event()

    def other() -> None:
        with logs.job_context("job_other"):
            inside.set()
            done.wait(5)
            seen["other"] = logs.current_job_id()

    t = threading.Thread(target=other)
    t.start()
    inside.wait(5)
    seen["main"] = logs.current_job_id()
    done.set()
    t.join(5)
    assert seen == {"other": "job_other", "main": None}


def test_a_job_route_logs_with_its_job_id(captured: io.StringIO) -> None:
    from service.jobs.router import JobLogRoute

    router = APIRouter(prefix="/jobs", route_class=JobLogRoute)

    @router.get("/{job_id}/plan")
    def plan(job_id: str) -> dict[str, str]:  # a sync route: FastAPI runs it in a worker thread
        log.info("plan read")
        return {"id": job_id}

    @router.get("/{job_id}")
    async def get(job_id: str) -> dict[str, str]:
        log.info("job read")
        return {"id": job_id}

    app = FastAPI()
    app.include_router(router)
    with TestClient(app) as client:
        assert client.get("/jobs/job_sync/plan").status_code == 200
        assert client.get("/jobs/job_async").status_code == 200
    text = captured.getvalue()
    assert "[job=job_sync] plan read" in text
    assert "[job=job_async] job read" in text


def test_the_celery_worker_logs_through_ftq(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from celery.signals import setup_logging

    from ftq.runtime.settings import get_settings

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    monkeypatch.setenv("FTQ_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    try:
        import worker.celery_app  # noqa: F401  (connects the signal)

        # What `celery worker --loglevel DEBUG` sends; with a receiver, Celery configures nothing itself.
        setup_logging.send(sender=None, loglevel="DEBUG", logfile=None, format="", colorize=False)
        added = [h for h in root.handlers if h not in handlers]
        assert len(added) == 1 and any(isinstance(f, logs.JobIdFilter) for f in added[0].filters)
        assert root.level == logging.DEBUG
        formatter = added[0].formatter
        assert formatter is not None and formatter._fmt == logs.FORMAT
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)
        get_settings.cache_clear()
