"""After a failed run (worker/recovery.py): why it failed, including a run that left no trace, and whether
the operator's policy sends it round again."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftq.contract.errors import ErrorCode
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
