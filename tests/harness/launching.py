"""Typed launch requests for launcher tests that run a script of their own rather than a rendered job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ftq.contract.plans import Plan
from ftq.contract.spec import JobSpec
from worker.launchers.base import LaunchRequest

_SPEC = {
    "model": {"name_or_path": "./tiny/model"},
    "dataset": {"name_or_path": "./tiny/data"},
    "training": {"max_steps": 1},
}


def launch_request(
    job_id: str,
    run_dir: Path,
    *,
    sbatch_script: str | None = None,
    resources: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    device: str = "cpu",
) -> LaunchRequest:
    """A request whose plan carries only the scripts the test wrote: the launchers read nothing else."""
    spec = JobSpec.model_validate({**_SPEC, "resources": {"device": device}})
    plan = Plan(
        accelerate_config={},
        accelerate_config_yaml="",
        command=[],
        sbatch_script=sbatch_script,
        trainer_args={},
        launch_script=(run_dir / "launch.sh").read_text() if (run_dir / "launch.sh").is_file() else "",
    )
    return LaunchRequest(
        job_id=job_id, run_dir=run_dir, spec=spec, plan=plan, resources=resources or {}, env=env or {}
    )
