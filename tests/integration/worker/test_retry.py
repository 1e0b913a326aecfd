"""FTQ_RETRY_PREEMPTED: a job that ended preempted goes round again, resuming from its newest checkpoint.

In-process reconcile on a real SQLite store with the real local launcher. Two stand-ins, both named:
the interpreter the launch runs is `/bin/echo` (so each attempt writes its exact trainer argv to
train.log and ends, instead of training; resuming for real is in
tests/integration/preflight/test_checkpoints.py), and the launcher
reports the first end of a run as SLURM's accounting reports a preempted job (`PREEMPTED`), which a
CPU machine cannot produce.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftq import runs
from tests.harness import tiny_spec
from tests.harness.inprocess import migrate, reset_caches, use_settings
from worker.launchers.base import RunPhase, RunRef, RunState
from worker.launchers.local import LocalLauncher


class PreemptingLauncher(LocalLauncher):
    """The local launcher, except that the next `preempt` ends of runs read as SLURM's PREEMPTED."""

    def __init__(self, preempt: int) -> None:
        super().__init__()
        self.preempt = preempt

    def poll(self, refs: list[RunRef]) -> dict[str, RunState]:
        states = super().poll(refs)
        for job_id, state in states.items():
            if state.phase == RunPhase.exited and self.preempt > 0:
                self.preempt -= 1
                states[job_id] = RunState(phase=RunPhase.exited, exit_code=0, reason="PREEMPTED")
        return states


@pytest.fixture
def store(tmp_path: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    use_settings(monkeypatch, data_dir=tmp_path, local_roots=f"{tmp_path}:{tiny_dir}", python="/bin/echo")
    migrate()
    yield tmp_path / "runs"
    reset_caches()


def retries(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    from ftq.settings import get_settings

    monkeypatch.setenv("FTQ_RETRY_PREEMPTED", str(n))
    get_settings.cache_clear()


def add_job(job_id: str, tiny: Path) -> Path:
    from ftq.render import render_plan
    from ftq.settings import get_settings
    from ftq.spec import JobSpec
    from ftq.store.db import session_scope
    from ftq.store.models import Job
    from ftq.store.repository import utcnow

    settings = get_settings()
    spec = JobSpec.model_validate(tiny_spec(tiny, max_steps=4, save_steps=2))
    run_dir = settings.runs_dir / job_id
    plan = render_plan(spec, job_id=job_id, run_dir=run_dir, settings=settings)
    now = utcnow()
    with session_scope() as s:
        s.add(
            Job(
                id=job_id,
                name=job_id,
                owner="t",
                status="queued",
                spec=spec.model_dump(mode="json"),
                plan=plan.model_dump(mode="json"),
                launcher="local",
                device="cpu",
                created_at=now,
                updated_at=now,
                attempt=0,
                metrics_offset=0,
            )
        )
    # What the preempted attempt had saved before it was stopped.
    (run_dir / runs.CHECKPOINTS / "checkpoint-2").mkdir(parents=True)
    return run_dir


def settle(job_id: str, launcher: LocalLauncher, monkeypatch: pytest.MonkeyPatch, timeout: float = 30) -> Any:
    from ftq.store import repository
    from ftq.store.db import session_scope
    from worker import controller

    monkeypatch.setattr(controller, "get_launcher", lambda name: launcher)
    monkeypatch.setattr(controller, "STARTING_GRACE_SECONDS", 0.0)
    deadline = time.time() + timeout
    while time.time() < deadline:
        controller.reconcile()
        with session_scope() as s:
            job = repository.get_job(s, job_id)
            if job is not None and job.status in ("succeeded", "failed", "cancelled"):
                s.expunge(job)
                return job
        time.sleep(0.1)
    raise AssertionError(f"{job_id} did not end")


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
    assert "resume_from" in job.error_message
    assert len(attempts_in_log(run_dir)) == 2


def test_off_by_default(store: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = add_job("j_pre3", tiny_dir)
    job = settle("j_pre3", PreemptingLauncher(preempt=1), monkeypatch)
    assert (job.status, job.attempt, job.error_code) == ("failed", 0, "preempted")
    assert len(attempts_in_log(run_dir)) == 1
