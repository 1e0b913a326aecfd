"""After a failed run (worker/recovery.py): why it failed, including a run that left no trace, and whether
the operator's policy sends it round again."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftq.contract.errors import ErrorCode
from tests.harness.disk import small_tmpfs
from worker.launchers.base import RunPhase, RunState
from worker.recovery import RETRYABLE, note_pause, retries_used, should_retry, why_it_failed

LOST = RunState(phase=RunPhase.lost)


@pytest.mark.parametrize("code", sorted(RETRYABLE))
def test_preemption_and_node_failures_are_retried_up_to_the_limit(code: str) -> None:
    assert should_retry(code, attempt=0, retries=2)
    assert should_retry(code, attempt=1, retries=2)
    assert not should_retry(code, attempt=2, retries=2)
    assert not should_retry(code, attempt=0, retries=0)  # the default: never


def test_attempts_a_pause_ended_are_no_retries(tmp_path: Path) -> None:
    assert retries_used(2, tmp_path) == 2
    note_pause(tmp_path)
    note_pause(tmp_path)
    # Paused twice and resumed: the third attempt has used no retry yet.
    assert retries_used(2, tmp_path) == 0 and should_retry(ErrorCode.preempted, retries_used(2, tmp_path), 1)
    assert retries_used(3, tmp_path) == 1


@pytest.mark.parametrize("code", sorted(set(ErrorCode) - RETRYABLE))
def test_failures_that_say_something_about_the_job_are_never_retried(code: str) -> None:
    assert not should_retry(code, attempt=0, retries=100)


def test_a_lost_run_with_nothing_to_go_on_says_it_was_killed(tmp_path: Path) -> None:
    for state in (LOST, RunState(phase=RunPhase.lost, reason="no process and no exit status")):
        failure = why_it_failed(tmp_path, state)
        assert failure.code == ErrorCode.unknown
        assert "processes are gone" in failure.message and "SIGKILL" in failure.message
        assert "resume_from" in failure.message


def test_a_lost_run_whose_log_says_why_gets_that_reason(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text(
        "step 3\nftq-error: dataset_error: column 'text' not found; set dataset.text_field\n"
    )
    failure = why_it_failed(tmp_path, LOST)
    assert failure.code == ErrorCode.dataset_error
    assert failure.message == "column 'text' not found; set dataset.text_field"


def test_a_lost_slurm_job_keeps_the_schedulers_reason(tmp_path: Path) -> None:
    failure = why_it_failed(tmp_path, RunState(phase=RunPhase.lost, reason="NODE_FAIL"))
    assert failure.code == ErrorCode.node_failure
    preempted = why_it_failed(tmp_path, RunState(phase=RunPhase.lost, reason="PREEMPTED"))
    assert preempted.code == ErrorCode.preempted and should_retry(preempted.code, 0, 1)


def test_an_exited_run_is_classified_by_its_exit_code_and_log(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text("Traceback (most recent call last):\nValueError: something odd\n")
    failure = why_it_failed(tmp_path, RunState(phase=RunPhase.exited, exit_code=3))
    assert failure.code == ErrorCode.unknown
    assert "exited with code 3" in failure.message and "ValueError: something odd" in failure.message
    # An exit status of its own is not a lost run, even with no log at all.
    (tmp_path / "train.log").unlink()
    plain = why_it_failed(tmp_path, RunState(phase=RunPhase.exited, exit_code=1))
    assert "exited with code 1" in plain.message and "processes are gone" not in plain.message


def test_a_deleted_run_directory_is_reported_as_deleted(tmp_path: Path) -> None:
    """Issue 28, finding 9: not "killed (SIGKILL, e.g. by the out-of-memory killer)"."""
    gone = tmp_path / "job_0000000000000001"
    for state in (LOST, RunState(phase=RunPhase.exited, exit_code=1)):
        failure = why_it_failed(gone, state)
        assert "was deleted while the job ran" in failure.message and "SIGKILL" not in failure.message


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs of this test's own (the test runs as root), unmounted at the end."""
    with small_tmpfs(tmp_path / "disk", "64m") as where:
        yield where


def test_a_run_that_died_on_a_full_disk_is_reported_as_disk_full(small_disk: Path) -> None:
    """The checkpoint that filled the disk failed midway: neither its traceback nor the exit status
    could be written (a lost run, a log without ENOSPC), and a little space is left."""
    run = small_disk / "job_0000000000000002"
    run.mkdir()
    (run / "train.log").write_text("step 3 loss 1.2\nsaving checkpoint-4\n")
    free = shutil.disk_usage(small_disk).free
    with (run / "checkpoint.partial").open("wb") as f:
        f.truncate(0)
        f.write(b"\0" * (free - 2 * 1024**2))  # 2 MiB left: more than a log line needs
    failure = why_it_failed(run, LOST)
    assert failure.code == ErrorCode.disk_full, failure
    assert "MiB free" in failure.message and "SIGKILL" not in failure.message
