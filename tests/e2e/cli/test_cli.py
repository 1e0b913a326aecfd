"""The `ftq` client commands, run as subprocesses against the session's real `ftq up` (e2e/conftest.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from ftq.cli.output import LogLines
from tests.e2e.session import AUTH_TOKEN, TINY_SPEC, FinishedJob, Walkthrough
from tests.harness import (
    TINY_RELATIVE,
    Deployment,
    example_spec,
    free_port,
    one_process_example,
    run_ftq,
    tiny_spec,
)


def assert_one_clean_line(stderr: str) -> str:
    """An expected failure: exactly one line on stderr, prefixed `ftq:`, and no traceback."""
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("ftq: "), stderr
    return lines[0]


# The session's tiny job ---------------------------------------------------------------------------


@pytest.mark.slow  # a real tiny training run
def test_submit_follow_exits_0_when_the_job_succeeds(server: Deployment, finished_job: FinishedJob) -> None:
    result = finished_job.result
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{server.log_tail()}"
    assert "Traceback" not in result.stderr
    job = server.get(f"/jobs/{finished_job.job_id}")
    assert job["status"] == "succeeded"
    out = result.stdout
    assert f"{finished_job.job_id}: queued" in out or f"{finished_job.job_id}: running" in out
    assert f"{finished_job.job_id} succeeded at step {job['progress']['step']}" in out
    # The log was streamed: the trainer's own lines appear in the follow output.
    log = server.get(f"/jobs/{finished_job.job_id}/logs", limit=1048576)["text"]
    last_log_line = [line for line in log.splitlines() if line.strip()][-1]
    assert LogLines().short(last_log_line).strip() in out  # with its short prefix: the time, not the date
    # And its events, one line each, numbered within the job (not by the server's id), the last one its end.
    events = server.get(f"/jobs/{finished_job.job_id}/events", limit=1000)["data"]
    assert [e["type"] for e in events][-1] == "job.succeeded"
    for n, e in enumerate(events, 1):
        assert re.search(rf"event {n}  {re.escape(e['type'])}\b", out), (e, out)


@pytest.mark.slow  # a real tiny training run
def test_ls_shows_the_job(server: Deployment, finished_job: FinishedJob) -> None:
    result = run_ftq("ls", url=server.url)
    assert result.returncode == 0, result.stderr
    row = next((line for line in result.stdout.splitlines() if finished_job.job_id in line), None)
    assert row is not None, result.stdout
    assert "succeeded" in row and "tiny" in row
    assert re.search(r"\b(\d+)/\1 \(100%\)", row), row

    failed_only = run_ftq("ls", "--status", "failed", url=server.url)
    assert failed_only.returncode == 0
    assert finished_job.job_id not in failed_only.stdout


@pytest.mark.slow  # a real tiny training run
def test_status_logs_metrics_and_cancel_of_a_finished_job(
    server: Deployment, finished_job: FinishedJob
) -> None:
    job_id = finished_job.job_id
    status = run_ftq("status", job_id, url=server.url)
    assert status.returncode == 0, status.stderr
    assert re.search(r"status\s+succeeded", status.stdout)
    as_json = run_ftq("status", job_id, "--json", url=server.url)
    assert json.loads(as_json.stdout)["id"] == job_id

    logs = run_ftq("logs", job_id, url=server.url)
    assert logs.returncode == 0
    api_text = server.get(f"/jobs/{job_id}/logs", limit=1048576)["text"]
    assert logs.stdout == api_text and api_text

    points = server.get(f"/jobs/{job_id}/metrics")["data"]
    losses = [p for p in points if p["loss"] is not None]
    metrics = run_ftq("metrics", job_id, url=server.url)
    assert metrics.returncode == 0, metrics.stderr
    assert "STEP" in metrics.stdout and "LOSS" in metrics.stdout
    spark = re.search(r"^loss\s+([▁▂▃▄▅▆▇█]+)\s", metrics.stdout, re.M)
    assert spark, metrics.stdout
    assert len(spark.group(1)) == min(len(losses), 60)
    assert f"({len(losses)} points)" in metrics.stdout

    cancel = run_ftq("cancel", job_id, url=server.url)
    assert cancel.returncode == 0
    assert f"{job_id}: succeeded" in cancel.stdout  # a finished job stays as it is


@pytest.mark.slow  # a real launch, which fails reading its data
def test_ls_and_metrics_say_why_a_failed_job_failed(server: Deployment) -> None:
    # Good first rows (what preflight reads), then a row that is not JSON: the trainer fails on it.
    data = server.data_dir / "broken.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(200)) + "{not json\n")
    spec = tiny_spec(TINY_RELATIVE, name="broken-data")
    spec["dataset"]["name_or_path"] = str(data)
    job = server.wait_terminal(server.post_job(spec)["id"])
    assert job["status"] == "failed" and job["error"], job
    code = job["error"]["code"]

    listed = run_ftq("ls", url=server.url)
    row = next((line for line in listed.stdout.splitlines() if job["id"] in line), None)
    assert row is not None and "failed" in row and f"{code}:" in row, listed.stdout

    metrics = run_ftq("metrics", job["id"], url=server.url)
    assert metrics.returncode == 0, metrics.stderr
    assert "yet" not in metrics.stdout and f"logged no metrics: {code}" in metrics.stdout, metrics.stdout


@pytest.mark.slow  # a real tiny training run
def test_curl_walkthrough_runs_as_written(
    server: Deployment, finished_job: FinishedJob, walkthrough: Walkthrough
) -> None:
    code, output = walkthrough.wait()
    assert code == 0, output
    for step in ("== 1.", "== 2.", "== 3.", "== 4.", "== 5.", "== 6.", "== 7."):
        assert step in output
    assert "distributed_type: DEEPSPEED" in output  # the dry run of the Falcon job
    assert re.search(r"job_[0-9a-f]+: (cancelled|cancelling)\n", output)
    job_id = re.search(r"job id: (job_[0-9a-f]+)", output)
    assert job_id
    assert server.get(f"/jobs/{job_id.group(1)}")["status"] == "succeeded"
    assert re.search(rf"{job_id.group(1)} succeeded\n", output)


# Submitting ---------------------------------------------------------------------------------------


def test_dry_run_prints_config_command_script_and_estimate(server: Deployment) -> None:
    before = len(server.get("/jobs", limit=500)["data"])
    result = run_ftq("submit", "examples/falcon-180b-lora-zero3.yaml", "--dry-run", url=server.url)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "distributed_type: DEEPSPEED" in out and "zero_stage: 3" in out
    assert "accelerate.commands.launch" in out and "-m trainer" in out
    assert "#SBATCH --nodes=2" in out
    assert "memory estimate" in out
    # The 180B model's config.json is not on this machine: the plan says so instead of guessing.
    assert re.search(r"per device: .+ of .+: (fits|does not fit)|no estimate: ", out), out
    assert len(server.get("/jobs", limit=500)["data"]) == before  # nothing stored

    local = run_ftq("submit", str(TINY_SPEC), "--dry-run", url=server.url)
    assert local.returncode == 0, local.stderr
    assert "launch script (launch.sh)" in local.stdout
    assert re.search(r"per device: [\d.]+ [KMG]iB of [\d.]+ GiB: fits", local.stdout), local.stdout


@pytest.mark.slow  # a real tiny training run
def test_idempotency_key_returns_the_same_job(server: Deployment, tmp_path: Path) -> None:
    spec = tmp_path / "long.json"
    spec.write_text(json.dumps(one_process_example(max_steps=100000)))
    first = run_ftq("submit", str(spec), "--idempotency-key", "cli-retry-1", url=server.url)
    second = run_ftq("submit", str(spec), "--idempotency-key", "cli-retry-1", url=server.url)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    ids = [re.search(r"submitted (job_[0-9a-f]+)", r.stdout) for r in (first, second)]
    assert ids[0] and ids[1] and ids[0].group(1) == ids[1].group(1)
    cancel = run_ftq("cancel", ids[0].group(1), url=server.url)
    assert cancel.returncode == 0
    assert re.search(r": (cancelled|cancelling)", cancel.stdout)


def test_missing_file_fails_cleanly(server: Deployment) -> None:
    result = run_ftq("submit", "missing.yaml", url=server.url)
    assert result.returncode == 2
    line = assert_one_clean_line(result.stderr)
    assert "missing.yaml: no such file" in line


def test_bad_yaml_fails_cleanly_with_its_position(server: Deployment, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel:\n  name_or_path: [unclosed\n")
    result = run_ftq("submit", str(bad), url=server.url)
    assert result.returncode == 2
    line = assert_one_clean_line(result.stderr)
    assert "not valid YAML" in line and "line" in line

    not_a_mapping = tmp_path / "list.yaml"
    not_a_mapping.write_text("- a\n- b\n")
    result = run_ftq("submit", str(not_a_mapping), url=server.url)
    assert result.returncode == 2
    assert "a job spec is a mapping" in assert_one_clean_line(result.stderr)


def test_422_names_the_failing_field(server: Deployment, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(example_spec(max_steps=0)))
    result = run_ftq("submit", str(bad), url=server.url)
    assert result.returncode == 1
    line = assert_one_clean_line(result.stderr)
    assert line.startswith("ftq: invalid spec: training.max_steps: "), line

    outside = example_spec()
    outside["model"]["name_or_path"] = "/etc"
    bad.write_text(yaml.safe_dump(outside))
    result = run_ftq("submit", str(bad), url=server.url)
    assert result.returncode == 1
    line = assert_one_clean_line(result.stderr)
    assert "model.name_or_path" in line and "allowed local roots" in line

    as_json = tmp_path / "bad.json"
    as_json.write_text(json.dumps({**example_spec(), "resources": {"launcher": "mars"}}))
    result = run_ftq("submit", str(as_json), url=server.url)
    assert result.returncode == 1
    assert "resources.launcher" in assert_one_clean_line(result.stderr)


def test_unknown_job_is_a_clean_404(server: Deployment) -> None:
    for args in (
        ("status", "job_0000000000000000"),
        ("logs", "job_0000000000000000"),
        ("metrics", "job_0000000000000000"),
        ("cancel", "job_0000000000000000"),
        ("artifacts", "job_0000000000000000"),
        ("download", "job_0000000000000000"),
    ):
        result = run_ftq(*args, url=server.url)
        assert result.returncode == 1, args
        assert "not found (404)" in assert_one_clean_line(result.stderr)


# Connection and auth ------------------------------------------------------------------------------


def test_server_down_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for args in (("ls",), ("status", "job_x"), ("submit", str(TINY_SPEC))):
        result = run_ftq(*args, url=url)
        assert result.returncode == 3, (args, result.stderr)
        line = assert_one_clean_line(result.stderr)
        assert f"cannot reach the ftq server at {url}" in line


def test_bad_url_is_one_line() -> None:
    result = run_ftq("ls", url="not-a-url")
    assert result.returncode == 2
    assert "FTQ_URL" in assert_one_clean_line(result.stderr)


def test_401_without_or_with_a_wrong_token(auth_server: Deployment) -> None:
    missing = run_ftq("ls", url=auth_server.url)
    assert missing.returncode == 1
    line = assert_one_clean_line(missing.stderr)
    assert "unauthorized (401)" in line and "set FTQ_TOKEN" in line

    wrong = run_ftq("ls", url=auth_server.url, token="not-the-token")
    assert wrong.returncode == 1
    assert "check FTQ_TOKEN" in assert_one_clean_line(wrong.stderr)

    right = run_ftq("ls", url=auth_server.url, token=AUTH_TOKEN)
    assert right.returncode == 0, right.stderr
    assert "no jobs" in right.stdout
