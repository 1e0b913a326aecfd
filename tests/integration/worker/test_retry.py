"""FTQ_RETRY_PREEMPTED: a job that ended preempted goes round again, resuming from its newest checkpoint.

In-process reconcile on a real SQLite store with the real local launcher. Two stand-ins, both named:
the interpreter the launch runs is `/bin/echo` (so each attempt writes its exact trainer argv to
train.log and ends, instead of training; resuming for real is in
tests/integration/preflight/test_checkpoints.py), and the launcher
reports the first end of a run as SLURM's accounting reports a preempted job (`PREEMPTED`), which a
CPU machine cannot produce.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ftq.contract import runs
from ftq.contract.status import TERMINAL
from ftq.store.models import Job
from tests.harness import rows, tiny_spec
from tests.harness.assets import checkpoint_dir
from tests.harness.inprocess import migrate, reset_caches, use_settings
from worker.launchers.base import RunPhase, RunRef, RunState
from worker.launchers.local import LocalLauncher


class PreemptingLauncher(LocalLauncher):
    """The local launcher, except that the next `preempt` ends of runs read as SLURM's `reason`
    (PREEMPTED, or TIMEOUT), each after `on_end` (what that attempt saved) has run."""

    def __init__(
        self, preempt: int, reason: str = "PREEMPTED", on_end: Callable[[int], None] | None = None
    ) -> None:
        super().__init__()
        self.preempt = preempt
        self.reason = reason
        self.on_end = on_end
        self.ends = 0

    def poll(self, refs: list[RunRef]) -> dict[str, RunState]:
        states = super().poll(refs)
        for job_id, state in states.items():
            if state.phase == RunPhase.exited and self.preempt > 0:
                self.preempt -= 1
                if self.on_end is not None:
                    self.on_end(self.ends)
                self.ends += 1
                states[job_id] = RunState(phase=RunPhase.exited, exit_code=0, reason=self.reason)
        return states


@pytest.fixture
def store(tmp_path: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    use_settings(monkeypatch, data_dir=tmp_path, local_roots=f"{tmp_path}:{tiny_dir}", python="/bin/echo")
    migrate()
    yield tmp_path / "runs"
    reset_caches()


def retries(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    from ftq.runtime.settings import get_settings

    monkeypatch.setenv("FTQ_RETRY_PREEMPTED", str(n))
    get_settings.cache_clear()


def add_job(job_id: str, tiny: Path, *, requeue_on_timeout: bool = False) -> Path:
    from ftq.contract.spec import JobSpec
    from ftq.planning.render import render_plan
    from ftq.runtime.settings import get_settings

    settings = get_settings()
    body = tiny_spec(tiny, max_steps=4, save_steps=2)
    if requeue_on_timeout:
        # A SLURM job's spec; the stand-in launcher below runs it locally all the same.
        body["resources"].update(
            launcher="slurm", slurm={"time_limit": "1:00:00", "requeue_on_timeout": True}
        )
    spec = JobSpec.model_validate(body)
    run_dir = settings.runs_dir / job_id
    plan = render_plan(spec, job_id=job_id, run_dir=run_dir, settings=settings)
    rows.add_job(job_id, spec=spec.model_dump(mode="json"), plan=plan.model_dump(mode="json"))
    # What the preempted attempt had saved before it was stopped.
    checkpoint_dir(run_dir, 2)
    return run_dir


def settle(job_id: str, launcher: LocalLauncher, monkeypatch: pytest.MonkeyPatch, timeout: float = 30) -> Job:
    from worker import controller, lifecycle

    monkeypatch.setattr(controller, "get_launcher", lambda name: launcher)
    monkeypatch.setattr(lifecycle, "STARTING_GRACE_SECONDS", 0.0)
    return rows.sweep_until(lambda: rows.get_job(job_id), TERMINAL, timeout)


def attempts_in_log(run_dir: Path) -> list[str]:
    return [ln for ln in (run_dir / runs.TRAIN_LOG).read_text().splitlines() if "-m trainer" in ln]


def test_a_preempted_job_is_resumed_from_its_checkpoint(
    store: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    retries(monkeypatch, 2)
    run_dir = add_job("j_pre", tiny_dir)
    job = settle("j_pre", PreemptingLauncher(preempt=1), monkeypatch)
    assert (job.status, job.attempt, job.error_code) == ("succeeded", 1, None)
    first, second = attempts_in_log(run_dir)
    assert "--resume_from_checkpoint" not in first
    assert second.endswith("--resume_from_checkpoint latest")
    assert "--resume_from_checkpoint latest" in (run_dir / runs.LAUNCH_SCRIPT).read_text()
    # The first attempt's records were set aside, not adopted as the second one's.
    assert (run_dir / "launch.json.attempt0").is_file() and (run_dir / "exit_status.attempt0").is_file()


def test_retries_stop_after_the_limit(store: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    retries(monkeypatch, 1)
    run_dir = add_job("j_pre2", tiny_dir)
    job = settle("j_pre2", PreemptingLauncher(preempt=2), monkeypatch)
    assert (job.status, job.attempt, job.error_code) == ("failed", 1, "preempted")
    assert "resume_from" in (job.error_message or "")
    assert len(attempts_in_log(run_dir)) == 2


def test_off_by_default(store: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = add_job("j_pre3", tiny_dir)
    job = settle("j_pre3", PreemptingLauncher(preempt=1), monkeypatch)
    assert (job.status, job.attempt, job.error_code) == ("failed", 0, "preempted")
    assert len(attempts_in_log(run_dir)) == 1


def test_a_checkpoint_cut_short_is_no_reason_to_resume(
    store: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    retries(monkeypatch, 1)
    run_dir = add_job("j_cut", tiny_dir)
    # The preempted attempt was killed while saving its only checkpoint.
    (run_dir / runs.CHECKPOINTS / "checkpoint-2" / "trainer_state.json").unlink()
    job = settle("j_cut", PreemptingLauncher(preempt=1), monkeypatch)
    assert (job.status, job.attempt) == ("succeeded", 1)
    assert all("--resume_from_checkpoint" not in a for a in attempts_in_log(run_dir))


def test_requeue_on_timeout_goes_round_while_each_attempt_gets_further(
    store: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Independent of FTQ_RETRY_PREEMPTED (0 here): the job's own requeue_on_timeout. The first two
    attempts each checkpoint further; the third stops at the time limit with nothing new (its only new
    folder was cut short while saving), so the job fails there instead of going round for ever."""
    run_dir = add_job("j_tl", tiny_dir, requeue_on_timeout=True)
    saved = {0: 2, 1: 3}  # the checkpoint attempt N left (attempt 0's checkpoint-2 is in add_job)

    def attempt_ended(n: int) -> None:
        if n in saved:
            checkpoint_dir(run_dir, saved[n])
        else:
            (checkpoint_dir(run_dir, 9) / "trainer_state.json").unlink()

    job = settle("j_tl", PreemptingLauncher(preempt=3, reason="TIMEOUT", on_end=attempt_ended), monkeypatch)
    assert (job.status, job.attempt, job.error_code) == ("failed", 2, "time_limit")
    first, *resumed = attempts_in_log(run_dir)
    assert "--resume_from_checkpoint" not in first
    assert len(resumed) == 2 and all(a.endswith("--resume_from_checkpoint latest") for a in resumed)


def test_a_time_limit_without_requeue_on_timeout_fails(
    store: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    retries(monkeypatch, 5)  # the preemption policy does not cover time limits
    run_dir = add_job("j_tl2", tiny_dir)
    job = settle("j_tl2", PreemptingLauncher(preempt=1, reason="TIMEOUT"), monkeypatch)
    assert (job.status, job.attempt, job.error_code) == ("failed", 0, "time_limit")
    assert len(attempts_in_log(run_dir)) == 1
