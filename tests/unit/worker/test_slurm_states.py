"""Every SLURM job state as a RunState, and the parsers of squeue, sacct and slurmstepd's output."""

from __future__ import annotations

from datetime import datetime

import pytest

from worker.launchers.base import RunPhase
from worker.launchers.slurm import (
    SLURM_STATES,
    decode_wait_status,
    parse_sacct,
    parse_squeue,
    reason_from_log,
    state_from_slurm,
)

P, R, E = RunPhase.pending, RunPhase.running, RunPhase.exited
# state -> (phase, reason, requeued); written out here independently of the module's table.
EXPECTED = {
    "PENDING": (P, None, False),
    "CONFIGURING": (P, None, False),
    "REQUEUED": (P, None, True),
    "REQUEUE_FED": (P, None, True),
    "REQUEUE_HOLD": (P, None, True),
    "SPECIAL_EXIT": (P, None, True),
    "RESV_DEL_HOLD": (P, None, False),
    "RUNNING": (R, None, False),
    "COMPLETING": (R, None, False),
    "SIGNALING": (R, None, False),
    "STAGE_OUT": (R, None, False),
    "RESIZING": (R, None, False),
    "SUSPENDED": (R, None, False),
    "STOPPED": (R, None, False),
    "COMPLETED": (E, None, False),
    "FAILED": (E, None, False),
    "CANCELLED": (E, "CANCELLED", False),
    "TIMEOUT": (E, "TIMEOUT", False),
    "DEADLINE": (E, "DEADLINE", False),
    "NODE_FAIL": (E, "NODE_FAIL", False),
    "BOOT_FAIL": (E, "BOOT_FAIL", False),
    "PREEMPTED": (E, "PREEMPTED", False),
    "OUT_OF_MEMORY": (E, "OUT_OF_MEMORY", False),
    "REVOKED": (E, "REVOKED", False),
}


def test_table_covers_every_documented_state() -> None:
    # The states `man squeue` (SLURM 22.05) lists under JOB STATE CODES, and nothing else.
    assert set(SLURM_STATES) == set(EXPECTED)


@pytest.mark.parametrize("state", sorted(EXPECTED))
def test_state(state: str) -> None:
    phase, reason, requeued = EXPECTED[state]
    got = state_from_slurm(state, exit_code=0)
    assert (got.phase, got.reason, got.requeued) == (phase, reason, requeued)
    if phase != E:
        assert got.exit_code is None


def test_exit_codes_and_signals() -> None:
    assert state_from_slurm("COMPLETED", exit_code=None).exit_code == 0
    failed = state_from_slurm("FAILED", exit_code=3)
    assert (failed.exit_code, failed.signal, failed.reason) == (3, None, None)
    killed = state_from_slurm("FAILED", signal=9)
    assert (killed.exit_code, killed.signal) == (137, 9)
    assert state_from_slurm("cancelled by 0", signal=15).reason == "CANCELLED"


def test_restarted_pending_job_is_requeued() -> None:
    assert state_from_slurm("PENDING", restarts=1).requeued
    assert not state_from_slurm("PENDING", restarts=0).requeued


def test_unknown_state_counts_as_running_while_queued() -> None:
    assert state_from_slurm("SOME_FUTURE_STATE").phase == R


def test_wait_status() -> None:
    assert decode_wait_status("0") == (0, None)
    assert decode_wait_status("768") == (3, None)
    assert decode_wait_status("9") == (None, 9)
    assert decode_wait_status("") == (None, None)


def test_parse_squeue_lines_as_printed_by_slurm_22_05() -> None:
    text = (
        "6|FAILED|NonZeroExitCode|768|0|\n"
        "7|FAILED|JobLaunchFailure|9|0|\n"
        "8|PENDING|BeginTime|0|1|\n"
        "9|RUNNING|None|0|0|\n"
        "10|COMPLETED|None|0|0|\n"
    )
    got = parse_squeue(text)
    assert got["6"].exit_code == 3 and got["6"].phase == E
    assert got["7"].signal == 9 and got["7"].exit_code == 137
    assert got["8"].phase == P and got["8"].requeued
    assert got["9"].phase == R
    assert got["10"].exit_code == 0 and got["10"].reason is None


def test_parse_sacct() -> None:
    text = "41|COMPLETED|0:0\n42|CANCELLED by 0|0:15\n43|TIMEOUT|0:0\n44|FAILED|2:0\n44.batch|FAILED|2:0\n"
    got = parse_sacct(text)
    assert set(got) == {"41", "42", "43", "44"}
    assert got["41"].exit_code == 0
    assert (got["42"].reason, got["42"].signal) == ("CANCELLED", 15)
    assert got["43"].reason == "TIMEOUT"
    assert got["44"].exit_code == 2


def test_reason_from_slurmstepd_lines() -> None:
    tail = (
        "step 1\n"
        "slurmstepd-vm: error: *** JOB 11 ON vm CANCELLED AT 2026-11-30T03:37:51 DUE TO JOB REQUEUE ***\n"
        "step 2\n"
    )
    assert reason_from_log(tail, "11") is None
    assert (
        reason_from_log(
            tail + "slurmstepd: error: *** JOB 11 ON vm CANCELLED AT 2026-11-30T03:40:00 "
            "DUE TO TIME LIMIT ***\n",
            "11",
        )
        == "TIMEOUT"
    )
    assert (
        reason_from_log("slurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026-11-30T03:40:00 ***", "12")
        == "CANCELLED"
    )
    assert (
        reason_from_log("*** JOB 12 ON n1 CANCELLED AT 2026-11-30T03:40:00 DUE TO PREEMPTION ***", "12")
        == "PREEMPTED"
    )
    # Another job's line (an earlier submission of the same run dir) says nothing about this one.
    assert reason_from_log("*** JOB 12 ON n1 CANCELLED AT 2026-11-30T03:40:00 ***", "13") is None


def test_squeue_pending_reason_and_times() -> None:
    """A pending job carries SLURM's reason (the job's queue.reason) and expected start; a started one its
    start, and an ended one its end (what the job's usage is counted from)."""
    text = (
        "20|PENDING|Priority|0|0|2026-12-01T15:00:00|2026-12-02T15:00:00|\n"
        "21|PENDING|Resources|0|0|N/A|N/A|\n"
        "22|RUNNING|None|0|0|2026-12-01T13:00:00|2026-12-01T14:00:00|\n"
        "23|COMPLETED|None|0|0|2026-12-01T12:00:00|2026-12-01T12:30:00|\n"
    )
    got = parse_squeue(text)
    at = lambda s: datetime.fromisoformat(s).timestamp()  # noqa: E731 (SLURM prints the local time)
    assert (got["20"].pending_reason, got["20"].expected_start) == ("Priority", at("2026-12-01T15:00:00"))
    assert (got["21"].pending_reason, got["21"].expected_start) == ("Resources", None)
    assert (got["22"].started_at, got["22"].ended_at, got["22"].pending_reason) == (
        at("2026-12-01T13:00:00"),
        None,
        None,
    )
    assert got["23"].ended_at is not None and got["23"].ended_at - got["23"].started_at == 1800  # type: ignore[operator]
    got = parse_sacct(
        "41|COMPLETED|0:0|2026-12-01T12:00:00|2026-12-01T12:10:00\n42|FAILED|1:0|Unknown|Unknown\n"
    )
    assert got["41"].ended_at - got["41"].started_at == 600  # type: ignore[operator]
    assert got["42"].started_at is None and got["42"].exit_code == 1
