"""The CLI in a terminal. Its follow loops keep following through a slow or restarting server: a timeout,
a dropped connection or a 503 is said once on stderr and polled through, up to the patience; a longer
outage (or any other failure) ends the command as before. `submit --follow` ends with the log's last
lines, then the job's end; `ftq ls` fits 80 columns with every header whole."""

from __future__ import annotations

import io
import json
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
from ftq.client import Artifact, Client, Event, ExportPublic, JobPublic, LogChunk, Point, _core
from ftq.client.errors import ConnectionFailed, ServerTimeout, Unavailable
from ftq.contract.schemas import Progress
from ftq.contract.status import JobStatus
from ftq.store import evaluations as ev_store
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
    assert lines[0].split() == ["ID", "NAME", "STATUS", "PROGRESS", "LOSS", "AGE"]
    # No room for an ERROR column: the error is a line under the table (the terminal wraps it).
    assert lines[3:] == [error_line]
    assert all(len(line) <= 80 for line in lines[:3]), lines
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:3]}  # every cell whole, the name too
    assert rows == {
        made[0]["id"]: [made[0]["name"], "failed", "0/4", "-", ANY],
        made[1]["id"]: [made[1]["name"], "queued", "0/4", "-", ANY],
    }

    wide = runner.invoke(app, ["ls"], env={"COLUMNS": "160"})
    assert wide.exit_code == 0, wide.output
    lines = wide.output.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATUS", "PROGRESS", "LOSS", "AGE", "ERROR"]
    assert len(lines) == 3 and all(len(line) <= 160 for line in lines), lines
    assert any("out_of_memory: CUDA out of memory" in line for line in lines[1:])  # in its column
    assert error_line not in lines
    assert f"{made[1]['name']}" in wide.output  # the whole name, where there is room


def test_ls_gives_the_name_the_room_and_cuts_it_only_where_it_must(
    make_client: MakeClient, tiny_job: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    api = make_client()
    fits = "tiny-cpu-lora-evaluations1"
    too_long = "tiny-cpu-lora-with-evaluations-and-a-name-too-long-for-80-cols"  # more than 28: cut before
    for name in (fits, too_long):
        assert api.post("/jobs", json={**tiny_job, "name": name}).status_code == 201
    monkeypatch.setattr(client_cli, "api", lambda: Client("http://testserver", "", transport=InProcess(api)))
    monkeypatch.setattr(output.out, "_width", None)
    runner = CliRunner()

    narrow = runner.invoke(app, ["ls"], env={"COLUMNS": "80"})
    assert narrow.exit_code == 0, narrow.output
    lines = narrow.output.splitlines()
    assert len(lines) == 3 and all(len(line) <= 80 for line in lines), lines
    assert lines[0].split() == ["ID", "NAME", "STATUS", "PROGRESS", "LOSS", "AGE"]
    cut, whole = lines[1].split()[1], lines[2].split()[1]  # newest first
    assert whole == fits
    assert cut.endswith("…") and too_long.startswith(cut[:-1]) and len(cut) >= len(fits)

    wide = runner.invoke(app, ["ls"], env={"COLUMNS": "200"})
    assert [line.split()[1] for line in wide.output.splitlines()[1:]] == [too_long, fits]


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


GRADER = {"type": "string_check", "name": "has_answer", "input": "{{sample.output_text}}",
          "reference": "{{item.answer}}", "operation": "ilike"}  # fmt: skip


def _evaluated(eval_id: str, metrics: dict[str, float]) -> None:
    with session_scope() as s:
        ev_store.EVALUATIONS.mark_starting(s, eval_id, resources=None)
        assert ev_store.EVALUATIONS.mark_running(s, eval_id, external_id=None, pid=None, pid_start_ticks=None)
        ev_store.store_metrics(s, eval_id, metrics)
        assert ev_store.EVALUATIONS.mark_finished(s, eval_id, JobStatus.succeeded, exit_code=0)
        s.commit()


@pytest.fixture
def evaluated_job(
    make_client: MakeClient, tiny_job: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> tuple[str, dict[str, str]]:
    """A succeeded job whose checkpoints 2 and 4 were scored (4 the best by qa/score) and whose final/ is
    queued for evaluation; the CLI talks to it in this process, at 80 columns. Returns its id and the
    evaluation ids by checkpoint."""
    api = make_client()
    spec = {**tiny_job, "name": "tiny-with-evaluations"}
    spec["eval"] = {
        "suites": [
            {"name": "qa", "type": "graders", "dataset": "./evaluation/qa.jsonl", "grader": GRADER},
            {"name": "held", "type": "loss", "dataset": "./tiny/data/eval.jsonl"},
        ],
        "on": "checkpoint",
        "select": {"metric": "qa/score", "mode": "max"},
    }
    r = api.post("/jobs", json=spec)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    ids: dict[str, str] = {}
    with session_scope() as s:
        assert repository.JOBS.mark_starting(s, job_id, resources=None)
        assert repository.JOBS.mark_running(s, job_id, external_id=None, pid=None, pid_start_ticks=None)
        for step in (2, 4):
            made = ev_store.add_evaluation(s, job_id, step=step, suites=None, trigger="checkpoint")
            ids[str(step)] = made.id
        assert repository.JOBS.mark_finished(s, job_id, JobStatus.succeeded, exit_code=0)
        ids["final"] = ev_store.add_evaluation(s, job_id, step=None, suites=None, trigger="final").id
        s.commit()
    _evaluated(ids["2"], {"qa/score": 0.25, "held/loss": 3.0, "held/a_much_longer_metric_name": 0.123456})
    _evaluated(ids["4"], {"qa/score": 0.75, "held/loss": 2.0})
    monkeypatch.setattr(client_cli, "api", lambda: Client("http://testserver", "", transport=InProcess(api)))
    monkeypatch.setattr(output.out, "_width", None)
    monkeypatch.setenv("COLUMNS", "80")
    return job_id, ids


def test_piped_status_has_no_padding_and_shows_the_best_checkpoint(
    evaluated_job: tuple[str, dict[str, str]],
) -> None:
    job_id, _ = evaluated_job
    shown = CliRunner().invoke(app, ["status", job_id])  # stdout is not a terminal here
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines and all(line == line.rstrip() for line in lines), lines
    assert f"id               {job_id}" in lines  # the keys in one column, the value right after
    assert "best checkpoint  step 4: qa/score 0.75 (the highest)" in lines


def test_evals_fit_80_columns_with_one_metric_a_line(evaluated_job: tuple[str, dict[str, str]]) -> None:
    job_id, ids = evaluated_job
    shown = CliRunner().invoke(app, ["evals", job_id])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert lines == [  # newest first
        f"{ids['final']}: queued final/",
        f"{ids['4']}: succeeded checkpoint 4",
        "  held/loss  2",
        "  qa/score   0.75",
        f"{ids['2']}: succeeded checkpoint 2",
        "  held/a_much_longer_metric_name  0.1235",
        "  held/loss                       3",
        "  qa/score                        0.25",
    ]
    as_json = CliRunner().invoke(app, ["evals", job_id, "--json"])
    results = {e["id"]: e["results"] for e in json.loads(as_json.output)}
    assert results[ids["2"]]["held/a_much_longer_metric_name"] == 0.123456  # every digit


def test_events_are_sentences_numbered_within_the_job(evaluated_job: tuple[str, dict[str, str]]) -> None:
    job_id, _ = evaluated_job
    shown = CliRunner().invoke(app, ["events", job_id])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert [line.split("  ")[0] for line in lines] == [f"event {n}" for n in range(1, len(lines) + 1)]
    assert "{" not in shown.output and "=" not in shown.output
    assert "job.evaluation  checkpoint 4 succeeded: held/loss 2, qa/score 0.75 (the best)" in shown.output


def test_a_followed_job_that_succeeded_says_how_to_wait_for_its_evaluations(
    evaluated_job: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    job_id, ids = evaluated_job
    with client_cli.api() as sdk:
        job = sdk.jobs.get(job_id)
        client_cli.evaluations_hint(sdk, job)
        assert capsys.readouterr().out.splitlines() == [
            "evaluations still to come: 1 queued or running",
            f"  wait for their results: ftq evals {job_id} --follow",
        ]
        _evaluated(ids["final"], {"qa/score": 0.5, "held/loss": 2.5})
        client_cli.evaluations_hint(sdk, job)
        assert capsys.readouterr().out == ""  # nothing left to wait for: no hint


def test_evals_follow_waits_for_every_evaluation_to_end(
    evaluated_job: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id, ids = evaluated_job
    polls: list[float] = []

    def one_poll(seconds: float) -> None:  # the final/ evaluation ends while the CLI waits
        polls.append(seconds)
        if len(polls) == 2:
            _evaluated(ids["final"], {"qa/score": 0.5, "held/loss": 2.5})

    monkeypatch.setattr(client_cli.time, "sleep", one_poll)
    shown = CliRunner().invoke(app, ["evals", job_id, "--follow"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert [line for line in lines if not line.startswith(" ")] == [  # oldest first, then each change
        f"{ids['2']}: succeeded checkpoint 2",
        f"{ids['4']}: succeeded checkpoint 4",
        f"{ids['final']}: queued final/",
        f"{ids['final']}: succeeded final/",
    ]
    assert lines[-2:] == ["  held/loss  2.5", "  qa/score   0.5"]
    assert len(polls) == 2


def test_the_follow_bar_says_what_the_job_does_until_its_first_step(
    make_client: MakeClient, tiny_job: dict[str, Any]
) -> None:
    api = make_client()
    queued = JobPublic.model_validate(api.post("/jobs", json=tiny_job).json())
    assert client_cli.bar_detail(queued.model_copy(update={"queue": None})) == "queued"

    def running(**progress: Any) -> JobPublic:
        return queued.model_copy(
            update={"status": "running", "queue": None, "progress": Progress(max_steps=40, **progress)}
        )

    loading = running(phase="loading", message="loading the tokenizer, dataset and model")
    assert client_cli.bar_detail(loading) == "loading the tokenizer, dataset and model"
    assert client_cli.bar_detail(running(step=0, phase="starting", message=None)) == "starting"
    training = running(step=5, phase="training", eta_seconds=12).model_copy(
        update={"latest_metrics": Point(step=5, loss=6.41312, learning_rate=9.76e-4)}
    )
    assert client_cli.bar_detail(training) == "step 5/40 loss 6.4131 lr 9.76e-04 eta 12s"
    saving = running(step=40, phase="saving", message="saving the final model")
    assert client_cli.bar_detail(saving) == "step 40/40 saving the final model"


def test_a_followed_job_prints_the_submitted_status_once_and_short_log_lines() -> None:
    stamp = "2026-12-07 20:59:42,346 trainer INFO "
    jobs = FeedJobs(
        [([3], f"{stamp}step 1/40  loss 6.4728  lr 1.00e-03  eta 0:00:23\n", False), ([9], "", True)]
    )
    screen = io.StringIO()
    # `submit` printed `queued` already; the feed prints the next status, and events numbered in the job.
    feed = client_cli.JobFeed(FakeFeed(jobs), "job_1", Console(file=screen, width=80), status="queued")  # type: ignore[arg-type]
    jobs.look()
    feed.catch_up("queued", ended=False)
    jobs.look()
    feed.catch_up("succeeded", ended=True)
    feed.end("succeeded")
    assert screen.getvalue().splitlines() == [
        "event 1  job.e3",
        "20:59:42 step 1/40  loss 6.4728  lr 1.00e-03",
        "event 2  job.e9",
        "job_1: succeeded",
    ]


CHECKPOINT_FILE = "checkpoints/checkpoint-20/adapter_model.safetensors"


class ArtifactJobs:
    def artifacts(self, job_id: str) -> list[Artifact]:
        sha = "4f1b6b44c6361d6e3a0b8f0e2a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b"
        return [
            Artifact(path=CHECKPOINT_FILE, size=30700, kind="checkpoint", sha256=sha),
            Artifact(path="final/adapter_model.safetensors", size=30700, kind="adapter", sha256=None),
        ]  # fmt: skip


class ArtifactClient:
    jobs = ArtifactJobs()

    def __enter__(self) -> ArtifactClient:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def test_artifacts_fit_80_columns_with_a_short_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_cli, "api", ArtifactClient)
    monkeypatch.setattr(output.out, "_width", None)
    sha = ArtifactJobs().artifacts("job_1")[0].sha256
    assert sha is not None
    runner = CliRunner()
    narrow = runner.invoke(app, ["artifacts", "job_1"], env={"COLUMNS": "80"})
    assert narrow.exit_code == 0, narrow.output
    lines = narrow.output.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].split() == ["PATH", "SIZE", "SHA256"]  # the kind gave way to the whole path
    assert lines[1].split() == [CHECKPOINT_FILE, "29.98", "KiB", sha[:12]]
    assert lines[2].split()[-1] == "(hashing)"
    wide = runner.invoke(app, ["artifacts", "job_1"], env={"COLUMNS": "120"})
    assert wide.output.splitlines()[0].split() == ["PATH", "KIND", "SIZE", "SHA256"]
    assert sha not in wide.output  # short there too: the whole one is a flag away
    full = runner.invoke(app, ["artifacts", "job_1", "--full-hash"], env={"COLUMNS": "80"})
    assert full.output.splitlines() == [  # as sha256sum prints them
        f"{sha}  {CHECKPOINT_FILE}",
        "(hashing)  final/adapter_model.safetensors",
    ]
    as_json = runner.invoke(app, ["artifacts", "job_1", "--json"], env={"COLUMNS": "80"})
    assert json.loads(as_json.output)[0]["sha256"] == sha


def test_logs_on_a_terminal_have_the_short_prefix_and_piped_the_file_as_it_is() -> None:
    stamp = "2026-12-07 20:59:42,346 trainer INFO "
    text = f"{stamp}step 1/40  loss 6.4728  lr 1.00e-03  grad norm 0.598  2,037 tokens/s  eta 0:00:23\n"
    text += "2026-12-07 20:59:43,001 trainer.memory WARNING rank 0 low\nTraceback (most recent call last):"
    chunks = [text[:30], text[30:100], text[100:]]  # lines split across chunks, the last one not ended
    screen, pipe = io.StringIO(), io.StringIO()
    short, raw = client_cli.LogWriter(screen, short=True), client_cli.LogWriter(pipe, short=False)
    for chunk in chunks:
        short(chunk)
        raw(chunk)
    short.end()
    raw.end()
    assert pipe.getvalue() == text
    assert screen.getvalue().splitlines() == [
        "20:59:42 step 1/40  loss 6.4728  lr 1.00e-03  grad norm 0.598  2,037 tokens/s",
        "20:59:43 WARNING trainer.memory rank 0 low",
        "Traceback (most recent call last):",
    ]
    assert all(len(line) <= 80 for line in screen.getvalue().splitlines())


def test_a_dry_run_says_a_hub_model_is_fetched_at_run_time_and_offline_refuses_it(
    make_client: MakeClient, tiny_job: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    import yaml

    api = make_client()
    monkeypatch.setattr(client_cli, "api", lambda: Client("http://testserver", "", transport=InProcess(api)))
    runner = CliRunner()
    local, hub = tmp_path / "local.yaml", tmp_path / "hub.yaml"
    local.write_text(yaml.safe_dump(tiny_job))
    hub.write_text(yaml.safe_dump({**tiny_job, "model": {"name_or_path": "some-owner/some-model"}}))

    plain = runner.invoke(app, ["submit", str(local), "--dry-run"], env={"COLUMNS": "200"})
    assert plain.exit_code == 0, plain.output
    assert "fetched at run time" not in plain.output
    fetched = runner.invoke(app, ["submit", str(hub), "--dry-run"], env={"COLUMNS": "200"})
    assert fetched.exit_code == 0, fetched.output  # a warning, not a refusal: the Hub may well have it
    assert "fetched at run time" in fetched.output
    assert "some-owner/some-model: not checked here; the run's first step downloads it" in fetched.output
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the server's environment (the app runs in this process)
    offline = runner.invoke(app, ["submit", str(hub), "--dry-run"], env={"COLUMNS": "200"})
    assert offline.exit_code == 1, offline.output
    assert "submit would refuse this job" in offline.output and "HF_HUB_OFFLINE=1" in offline.output
