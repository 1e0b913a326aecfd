"""The CLI in a terminal. Its follow loops keep following through a slow or restarting server: a timeout,
a dropped connection or a 503 is said once on stderr and polled through, up to the patience; a longer
outage (or any other failure) ends the command as before. `submit --follow` ends with the log's last
lines, then the job's end; `ftq ls` fits 80 columns with every header whole."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from unittest.mock import ANY

import httpx
import pytest
from fastapi.testclient import TestClient
from rich.console import Console
from typer.testing import CliRunner

from ftq.cli import app, output
from ftq.cli import client as client_cli
from ftq.client import Client, Event, ExportPublic, LogChunk, _core
from ftq.client.errors import ConnectionFailed, ServerTimeout, Unavailable
from ftq.contract.status import JobStatus
from ftq.store import repository
from ftq.store.db import session_scope
from tests.harness.inprocess import MakeClient

URL = "http://127.0.0.1:1"


def _export(status: str) -> ExportPublic:
    return ExportPublic.model_validate(
        {
            "id": "exp_1", "job_id": "job_1", "kind": "merged", "dtype": "bf16", "max_shard_size": "5GB",
            "push_to_hub": None, "status": status, "error": None, "path": "exports/exp_1",
            "created_at": datetime.now(UTC), "started_at": None, "finished_at": None,
        }
    )  # fmt: skip


class Jobs:
    """`client.jobs` whose get_export answers from a script: an export, or an error to raise."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers

    def get_export(self, job_id: str, export_id: str) -> ExportPublic:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]


class FakeClient:
    def __init__(self, answers: list[Any]) -> None:
        self.jobs = Jobs(answers)


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_cli, "POLL_SECONDS", 0.0)


def test_a_followed_export_is_polled_through_timeouts_and_503s(capsys: pytest.CaptureFixture[str]) -> None:
    answers: list[Any] = [
        ServerTimeout(URL),
        Unavailable(503, "unavailable", "the store is restarting"),
        _export("running"),
        ServerTimeout(URL),
        _export("succeeded"),
    ]
    ended = client_cli.follow_export(FakeClient(answers), "job_1", _export("queued"))  # type: ignore[arg-type]
    assert ended.status == "succeeded" and answers == []
    err = capsys.readouterr().err
    # Said once per outage, and that it is over: not a line per failed poll.
    assert err.count("still following") == 2 and err.count("answers again") == 2


def test_an_outage_longer_than_the_patience_ends_the_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(float(t) for t in range(0, 10_000, 100))
    monkeypatch.setattr(_core.time, "monotonic", lambda: next(clock))
    answers: list[Any] = [ServerTimeout(URL) for _ in range(10)]
    with pytest.raises(ServerTimeout):
        client_cli.follow_export(FakeClient(answers), "job_1", _export("running"))  # type: ignore[arg-type]
    assert len(answers) == 10 - 5  # 0, 100, 200, 300 s within OUTAGE_PATIENCE_SECONDS; raised at 400 s


def test_a_followed_export_rides_out_refused_connections_while_the_server_restarts() -> None:
    # The export was just made, so the server was there: refused now means it is restarting.
    answers: list[Any] = [ConnectionFailed(URL, "connection refused"), _export("succeeded")]
    ended = client_cli.follow_export(FakeClient(answers), "job_1", _export("running"))  # type: ignore[arg-type]
    assert ended.status == "succeeded" and answers == []


class FeedJobs:
    """`client.jobs` for a JobFeed: the events and the log there are at each look, from a script."""

    def __init__(self, looks: list[tuple[list[int], str, bool]]) -> None:
        self.looks = looks  # per look: the new event ids, the new log text, whether the log is complete
        self.events_now: list[int] = []
        self.log_now: tuple[str, bool] = ("", False)

    def look(self) -> None:
        self.events_now, text, complete = self.looks.pop(0)
        self.log_now = (text, complete)

    def iter_events(self, job_id: str, *, after: int) -> Iterator[Event]:
        at = datetime.now(UTC)
        for i in self.events_now:
            if i > after:
                yield Event(id=i, job_id=job_id, type=f"job.e{i}", time=at, data={})

    def log_chunks(self, job_id: str, *, offset: int) -> Iterator[LogChunk]:
        text, complete = self.log_now
        yield LogChunk(offset=offset, next_offset=offset + len(text), text=text, complete=complete)


def test_a_followed_job_ends_with_the_rest_of_its_log_then_its_last_events_then_its_status() -> None:
    jobs = FeedJobs([([1], "started\nstep 1\nhalf a li", False), ([2], "ne\nrank 1 done", True)])
    screen = io.StringIO()
    feed = client_cli.JobFeed(FakeFeed(jobs), "job_1", Console(file=screen, width=200))  # type: ignore[arg-type]
    jobs.look()
    assert not feed.catch_up("running", ended=False)
    jobs.look()
    assert feed.catch_up("succeeded", ended=True)
    feed.end("succeeded")
    assert screen.getvalue().splitlines() == [
        "job_1: running",
        "event 1  job.e1",
        "started",
        "step 1",
        "half a line",  # the rest of the log, written before the job ended
        "event 2  job.e2",
        "rank 1 done",  # the log's last line, unfinished: printed whole at the end
        "job_1: succeeded",
    ]


class FakeFeed:
    def __init__(self, jobs: FeedJobs) -> None:
        self.jobs = jobs


class InProcess(httpx.BaseTransport):
    """Each request of an SDK client answered by the app under a TestClient, in this process."""

    def __init__(self, app: TestClient) -> None:
        self.app = app

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        got = self.app.request(
            request.method, request.url.raw_path.decode(), headers=request.headers, content=request.read()
        )
        return httpx.Response(
            got.status_code, headers={"content-type": got.headers["content-type"]}, content=got.content
        )


def test_ls_fits_80_columns_with_every_header_whole(
    make_client: MakeClient, tiny_job: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    api = make_client()
    made = [api.post("/jobs", json={**tiny_job, "name": f"a-long-name-for-job-{i}"}).json() for i in range(2)]
    message = "CUDA out of memory: tried to allocate 2.00 GiB on device 0 with 512 MiB free"
    with session_scope() as session:  # a queued job may fail (it never started)
        assert repository.JOBS.mark_finished(
            session, made[0]["id"], JobStatus.failed, error_code="out_of_memory", error_message=message
        )
    error_line = f"{made[0]['id']}: out_of_memory: {message}"
    # The CLI's SDK client talks to the app in this process; the console reads COLUMNS as a terminal does.
    monkeypatch.setattr(client_cli, "api", lambda: Client("http://testserver", "", transport=InProcess(api)))
    monkeypatch.setattr(output.out, "_width", None)
    runner = CliRunner()

    narrow = runner.invoke(app, ["ls"], env={"COLUMNS": "80"})
    assert narrow.exit_code == 0, narrow.output
    lines = narrow.output.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATUS", "PROGRESS", "LOSS", "CREATED"]
    # No room for an ERROR column: the error is a line under the table (the terminal wraps it).
    assert lines[3:] == [error_line]
    assert all(len(line) <= 80 for line in lines[:3]), lines
    rows = {line.split()[0]: line.split()[2:] for line in lines[1:3]}  # the id, the status and on: whole
    assert rows == {
        made[0]["id"]: ["failed", "0/4", "-", ANY, "ago"],
        made[1]["id"]: ["queued", "0/4", "-", ANY, "ago"],
    }

    wide = runner.invoke(app, ["ls"], env={"COLUMNS": "160"})
    assert wide.exit_code == 0, wide.output
    lines = wide.output.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATUS", "PROGRESS", "LOSS", "CREATED", "ERROR"]
    assert len(lines) == 3 and all(len(line) <= 160 for line in lines), lines
    assert any("out_of_memory: CUDA out of memory" in line for line in lines[1:])  # in its column
    assert error_line not in lines
    assert f"{made[1]['name']}" in wide.output  # the whole name, where there is room


def test_pause_and_resume_through_the_sdk_and_the_cli(
    make_client: MakeClient, tiny_job: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ftq.client.errors import Conflict

    api = make_client()
    job = api.post("/jobs", json=tiny_job).json()
    sdk = Client("http://testserver", "", transport=InProcess(api))
    assert sdk.jobs.pause(job["id"]).status == "paused"
    assert sdk.jobs.resume(job["id"]).status == "queued"
    monkeypatch.setattr(client_cli, "api", lambda: Client("http://testserver", "", transport=InProcess(api)))
    runner = CliRunner()
    paused = runner.invoke(app, ["pause", job["id"]])
    assert paused.exit_code == 0 and paused.output.strip() == f"{job['id']}: paused", paused.output
    resumed = runner.invoke(app, ["resume", job["id"]])
    assert resumed.exit_code == 0 and resumed.output.strip() == f"{job['id']}: queued", resumed.output
    sdk.jobs.cancel(job["id"])
    with pytest.raises(Conflict) as info:
        sdk.jobs.resume(job["id"])
    assert info.value.code == "not_resumable"
    refused = runner.invoke(app, ["pause", job["id"]])
    assert refused.exit_code == 1 and "cancelled" in refused.output, refused.output
