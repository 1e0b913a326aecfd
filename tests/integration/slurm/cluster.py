"""The test cluster through the SLURM launcher: submitting a rendered plan, one run's state, waiting for a
phase, squeue's job ids; and the shipped tiny job sent to SLURM."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from ftq.contract.plans import Plan
from ftq.contract.spec import JobSpec
from ftq.runtime.settings import Settings
from tests.harness import example_spec, wait_until
from worker.launchers.base import LaunchRequest, RunPhase, RunRef, RunState
from worker.launchers.slurm import SlurmLauncher


def slurm_spec(tiny: Path, *, max_steps: int, dataset: str = "train.jsonl", name: str) -> dict[str, Any]:
    """examples/tiny-cpu.yaml, sent to SLURM, with fewer steps."""
    spec = example_spec(
        "tiny-cpu.yaml", max_steps=max_steps, logging_steps=1, save_steps=None, eval_steps=None
    )
    spec["name"] = name
    spec["dataset"]["name_or_path"] = str(tiny / "data" / dataset)
    spec["dataset"]["eval_split"] = None
    spec["resources"].update({"launcher": "slurm", "device": "cpu"})
    spec["resources"].setdefault("slurm", {})["time_limit"] = "00:10:00"
    return spec


def submit(
    settings: Settings, job_id: str, run_dir: Path, spec: JobSpec, plan: Plan, cleanup_jobs: list[str]
) -> tuple[SlurmLauncher, RunRef]:
    """The plan's job.sbatch submitted by the SLURM launcher (scancelled after the test through
    `cleanup_jobs`); the launcher and the run's reference to poll it by."""
    launcher = SlurmLauncher(settings)
    handle = launcher.submit(LaunchRequest(job_id=job_id, run_dir=run_dir, spec=spec, plan=plan))
    assert handle.external_id, handle
    cleanup_jobs.append(handle.external_id)
    return launcher, RunRef(job_id, run_dir, handle.external_id, None, None)


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
