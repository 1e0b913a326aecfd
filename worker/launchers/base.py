"""The launch interface: `submit`, `poll`, `cancel`. Nothing outside `worker/launchers/` knows which
implementation (local process group or SLURM batch job) it is talking to."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from ftq.contract.plans import Plan
from ftq.contract.spec import JobSpec, needs_fetch
from ftq.runtime.settings import REPO_ROOT, Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchRequest:
    job_id: str
    run_dir: Path
    spec: JobSpec | None  # validated, local paths already resolved; None for a run of no job's (an engine)
    plan: Plan  # rendered for this attempt (see ftq.planning.render)
    resources: dict[str, Any] = field(default_factory=dict)  # e.g. {"gpus": [0, 1]} or {"cpu_slots": 2}
    env: dict[str, str] = field(default_factory=dict)  # secrets and site env, never stored
    owner: str | None = None  # whose job: picks the user a local run starts as (FTQ_RUN_AS_USER)
    device: str | None = None  # cpu | cuda, where there is no spec to say it

    @property
    def on_cpu(self) -> bool:
        return (self.spec.resources.device if self.spec is not None else self.device) == "cpu"


@dataclass(frozen=True)
class LaunchHandle:
    external_id: str | None = None  # SLURM job id
    pid: int | None = None  # local: leader of the run's process group
    pid_start_ticks: int | None = None

    def __str__(self) -> str:
        """As the worker's log says it: `pid 23781`, `SLURM job 812`."""
        parts = [f"SLURM job {self.external_id}"] if self.external_id else []
        parts += [f"pid {self.pid}"] if self.pid is not None else []
        return ", ".join(parts) or "no process yet"


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
    pending_reason: str | None = None  # while pending: the scheduler's reason (SLURM's %r: Priority, ...)
    expected_start: float | None = None  # while pending: the scheduler's expected start (unix time)
    started_at: float | None = None  # the run's start and end by the scheduler's clock, where known
    ended_at: float | None = None

    def __str__(self) -> str:
        """As the worker's log says it: `exited, exit code 0`, `exited, signal 9`, `exited, TIMEOUT,
        requeued`, `pending (Priority)`; what is not known is left out (the repr has every field)."""
        parts = [str(self.phase) + (f" ({self.pending_reason})" if self.pending_reason else "")]
        parts += [f"exit code {self.exit_code}"] if self.exit_code is not None else []
        parts += [f"signal {self.signal}"] if self.signal is not None else []
        parts += [self.reason] if self.reason else []
        parts += ["requeued"] if self.requeued else []
        return ", ".join(parts)


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


# A run's environment is built from an allowlist, never by removing the service's secrets from a copy of
# the worker's: code in a run (remote code, a pickle in a checkpoint, a compromised package) sees only
# what the launch needs. Anything else an operator wants a run to have is named in FTQ_PASS_ENV.
RUN_ENV_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
        "PYTHONPATH", "PYTHONHASHSEED", "LD_LIBRARY_PATH", "XDG_CACHE_HOME", "PYTORCH_CUDA_ALLOC_CONF",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    }
)  # fmt: skip
# Device, communication, thread and library settings (CUDA_VISIBLE_DEVICES, NCCL_SOCKET_IFNAME,
# HF_HUB_OFFLINE, ...), less any of them that looks like a credential.
RUN_ENV_PREFIXES = (
    "LC_", "CUDA_", "NCCL_", "NVIDIA_", "TORCH_", "TORCHINDUCTOR_", "TRITON_", "OMP_", "MKL_", "KMP_",
    "GLOO_", "UCX_", "FI_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "WANDB_",
)  # fmt: skip
# The service's own settings (FTQ_API_TOKENS, FTQ_DATABASE_URL, FTQ_BROKER_URL, FTQ_METRICS_TOKEN...):
# never handed to a run, even when FTQ_PASS_ENV names one.
SERVICE_SETTINGS = frozenset({f"FTQ_{name.upper()}" for name in Settings.model_fields} | {"FTQ_HF_TOKEN"})
_CREDENTIAL = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)


def launch_environment(settings: Settings, source: Mapping[str, str] | None = None) -> dict[str, str]:
    """Where a run's environment starts: the allowlisted part of the worker's (`source`), plus the
    operator's secrets named in FTQ_PASS_ENV. Never the service's own settings (FTQ_API_TOKENS, the
    database and broker URLs)."""
    source = os.environ if source is None else source
    passed = set(settings.pass_env_names)
    env: dict[str, str] = {}
    for name, value in source.items():
        if name in SERVICE_SETTINGS:
            continue
        allowed = name in RUN_ENV_NAMES or (
            name.startswith(RUN_ENV_PREFIXES) and not _CREDENTIAL.search(name)
        )
        if allowed or name in passed:
            env[name] = value
    return env


def hub_environment(settings: Settings, spec: JobSpec) -> dict[str, str]:
    """The Hugging Face Hub side of the environment of a run whose spec names a hub model or dataset: the
    shared cache the fetch step fills and the ranks load from (FTQ_HUB_CACHE, as HF_HUB_CACHE) and the
    operator's token (FTQ_HF_TOKEN) as HF_TOKEN, which the fetch step and the ranks read from the
    environment (never from a file of the run). Nothing for a run of local paths: it asks the Hub
    nothing, so it gets no token (an export that pushes gets it apart, worker.exports)."""
    if not needs_fetch(spec):
        return {}
    env = {"HF_HUB_CACHE": str(settings.hub_cache_dir)}
    if settings.hub_token:
        env["HF_TOKEN"] = settings.hub_token
    return env


def tracker_environment(settings: Settings, spec: JobSpec) -> dict[str, str]:
    """Where the spec's trackers log, from the operator's settings (never from the spec): WANDB_MODE for a
    W&B run (its key comes through FTQ_PASS_ENV), MLFLOW_TRACKING_URI for an MLflow one."""
    env: dict[str, str] = {}
    trackers = spec.integrations
    if trackers.wandb is not None and settings.wandb_mode:
        env["WANDB_MODE"] = settings.wandb_mode
    if trackers.mlflow is not None and settings.mlflow_tracking_uri:
        # The URL without credentials: the run prints it and records it (trackers.json); the credentials
        # travel apart, in the variables MLflow's client reads, and are masked wherever text is served.
        env["MLFLOW_TRACKING_URI"] = settings.mlflow_url
        env.update(settings.mlflow_credentials())
    if trackers.report_to and any(t in trackers.report_to for t in ("wandb", "mlflow")):
        env["FTQ_TRACKER_FAILURE"] = settings.tracker_failure
        env["FTQ_TRACKER_CHECK_SECONDS"] = f"{settings.tracker_check_seconds:g}"
    return env


def grader_environment(settings: Settings, spec: JobSpec) -> dict[str, str]:
    """The tenant-code sandbox's settings for a run that scores graders or runs evaluation suites (GRPO's
    reward, an evaluation's graders and lm_eval task folders): the operator's FTQ_GRADER_* limits and
    FTQ_SANDBOX_BWRAP, which trainer.rewards reads back; nothing for the other runs."""
    if spec.training.grader is None and not spec.eval.suites:
        return {}
    env = {
        "FTQ_SANDBOX_BWRAP": settings.sandbox_bwrap,
        "FTQ_GRADER_CPU_SECONDS": str(settings.grader_cpu_seconds),
        "FTQ_GRADER_MEMORY_MB": str(settings.grader_memory_mb),
        "FTQ_GRADER_TIMEOUT_SECONDS": f"{settings.grader_timeout_seconds:g}",
        "FTQ_GRADER_PROCESSES": str(settings.grader_processes),
    }
    if settings.grader_python:
        env["FTQ_GRADER_PYTHON"] = settings.grader_python
    return env


def add_run_environment(env: dict[str, str], settings: Settings, req: LaunchRequest) -> None:
    """What every launcher adds to a run's environment: the operator's secrets (named in
    FTQ_PASS_ENV, never stored), the request's own variables, and ftq's code on PYTHONPATH so
    `-m trainer` imports the same trainer the service rendered for."""
    for name in settings.pass_env_names:
        if os.environ.get(name) and name not in SERVICE_SETTINGS:
            env[name] = os.environ[name]
    if req.spec is not None:
        env.update(hub_environment(settings, req.spec))
        env.update(tracker_environment(settings, req.spec))
        env.update(grader_environment(settings, req.spec))
    env.update(req.env)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
