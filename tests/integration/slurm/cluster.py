"""Polling the test cluster: one run's state through the launcher, waiting for a phase, squeue's job ids."""

from __future__ import annotations

import subprocess

from tests.harness import wait_until
from worker.launchers.base import RunPhase, RunRef, RunState
from worker.launchers.slurm import SlurmLauncher


def poll_one(launcher: SlurmLauncher, ref: RunRef) -> RunState:
    return launcher.poll([ref])[ref.job_id]


def wait_phase(launcher: SlurmLauncher, ref: RunRef, phases: set[RunPhase], timeout: float = 60) -> RunState:
    def look() -> RunState | None:
        state = poll_one(launcher, ref)
        return state if state.phase in phases else None

    return wait_until(f"job {ref.external_id} to be {sorted(phases)}", look, timeout)


def squeue_ids(*extra: str) -> set[str]:
    out = subprocess.run(
        ["squeue", "--noheader", "--format=%i", *extra], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())
