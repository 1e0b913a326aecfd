"""The launch interface: `submit`, `poll`, `cancel`. Nothing outside `worker/launchers/` knows which
implementation (local process group or SLURM batch job) it is talking to."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from ftq.render import Plan
from ftq.settings import REPO_ROOT, Settings
from ftq.spec import JobSpec


@dataclass(frozen=True)
class LaunchRequest:
    job_id: str
    run_dir: Path
    spec: JobSpec  # validated, local paths already resolved
    plan: Plan  # rendered for this attempt (see ftq.render)
    resources: dict[str, Any] = field(default_factory=dict)  # e.g. {"gpus": [0, 1]} or {"cpu_slots": 2}
    env: dict[str, str] = field(default_factory=dict)  # secrets and site env, never stored


@dataclass(frozen=True)
class LaunchHandle:
    external_id: str | None = None  # SLURM job id
    pid: int | None = None  # local: leader of the run's process group
    pid_start_ticks: int | None = None


@dataclass(frozen=True)
class RunRef:
    job_id: str
    run_dir: Path
    external_id: str | None
    pid: int | None
    pid_start_ticks: int | None


class RunPhase(StrEnum):
    pending = "pending"  # accepted but not started (SLURM PENDING, CONFIGURING)
    running = "running"
    exited = "exited"  # ended; exit_code / signal / reason say how
    lost = "lost"  # no trace of it: no process, not in the scheduler, no exit status


@dataclass(frozen=True)
class RunState:
    phase: RunPhase
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None  # scheduler's word for the end: TIMEOUT, PREEMPTED, NODE_FAIL, OUT_OF_MEMORY...
    requeued: bool = False


class Launcher(Protocol):
    name: str

    def submit(self, req: LaunchRequest) -> LaunchHandle: ...

    def poll(self, runs: list[RunRef]) -> dict[str, RunState]:
        """State of every run in one batched look (one squeue call, one /proc scan)."""
        ...

    def cancel(self, run: RunRef) -> None:
        """Ask the run to stop. Returns at once; `poll` says when it has gone."""
        ...

    def find(self, run_dir: Path) -> LaunchHandle | None:
        """A launch made earlier from this run directory (its records), when its worker died before
        storing the handle. A handle with neither pid nor external id: the run already ended."""
        ...

    def kill_leftovers(self, run: RunRef) -> None:
        """After the run has ended, stop whatever of it is still alive (orphaned ranks)."""
        ...


# Operator settings that hold credentials; a training run has no use for them.
WITHHELD_ENV = ("FTQ_API_TOKENS", "FTQ_DATABASE_URL", "FTQ_BROKER_URL")


def service_environment() -> dict[str, str]:
    """The worker's environment less the service's own credentials: where a run's environment starts."""
    return {k: v for k, v in os.environ.items() if k not in WITHHELD_ENV}


def add_run_environment(env: dict[str, str], settings: Settings, req: LaunchRequest) -> None:
    """What every launcher adds to a run's environment: the operator's secrets (named in
    FTQ_PASS_ENV, never stored), the request's own variables, and ftq's code on PYTHONPATH so
    `-m trainer` imports the same trainer the service rendered for."""
    for name in settings.pass_env_names:
        if os.environ.get(name):
            env[name] = os.environ[name]
    env.update(req.env)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
