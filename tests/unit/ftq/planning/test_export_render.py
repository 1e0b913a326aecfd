"""ftq.planning.render's export launch: one process, `python -m trainer.export` with the server's paths,
quoted;
on SLURM a one-task batch script in the export's folder that records its exit status."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ftq.contract import runs
from ftq.contract.spec import JobSpec
from ftq.planning.render import render_export_plan
from ftq.runtime.settings import Settings

EXPORT_DIR = Path("/shared/ftq runs/job_1/exports/exp_1")


def spec(**resources: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "model": {"name_or_path": "./m"},
            "dataset": {"name_or_path": "./d.jsonl"},
            "training": {"max_steps": 1},
            "distributed": {"strategy": "ddp"},
            "resources": resources,
        }
    )


def settings() -> Settings:
    return Settings(python="/opt/py/bin/python", slurm_partition="gpu")


def test_local_export_is_one_quoted_process_writing_its_exit_status() -> None:
    plan = render_export_plan(
        spec(launcher="local", device="cpu"), export_id="exp_1", export_dir=EXPORT_DIR, settings=settings()
    )
    assert plan.command == [
        "/opt/py/bin/python",
        "-m",
        "trainer.export",
        "--request",
        str(EXPORT_DIR / runs.EXPORT_REQUEST),
    ]
    assert plan.sbatch_script is None
    assert f"cd -- {shlex.quote(str(EXPORT_DIR))}" in plan.launch_script
    assert shlex.quote(str(EXPORT_DIR / runs.EXPORT_REQUEST)) in plan.launch_script
    assert runs.EXIT_STATUS in plan.launch_script
    # Under a shell of its own, so a local cancel's SIGTERM (sent below the launch script's child) reaches it.
    assert """bash -c '"$@"; exit "$?"' ftq-export /opt/py/bin/python""" in plan.launch_script


def test_slurm_export_is_one_task_with_one_gpu_in_the_jobs_partition() -> None:
    plan = render_export_plan(
        spec(launcher="slurm", device="cuda", num_nodes=2, processes_per_node=8),
        export_id="exp_1",
        export_dir=EXPORT_DIR,
        settings=settings(),
    )
    script = plan.sbatch_script or ""
    assert "#SBATCH --job-name=ftq-exp_1" in script
    assert "#SBATCH --nodes=1" in script and "#SBATCH --ntasks=1" in script
    assert "#SBATCH --gres=gpu:1" in script and "#SBATCH --partition=gpu" in script
    assert f'#SBATCH --chdir="{EXPORT_DIR}"' in script
    assert "trap 'write_exit_status $?' EXIT" in script
    assert "-m trainer.export" in script and "--requeue" not in script
    assert f"#SBATCH --cpus-per-task={settings().slurm_cpus_per_gpu}" in script


def test_a_cpu_export_on_slurm_asks_for_one_cpu() -> None:
    # As a one-process CPU job asks: more than a node has would leave it pending forever.
    plan = render_export_plan(
        spec(launcher="slurm", device="cpu"), export_id="e", export_dir=EXPORT_DIR, settings=settings()
    )
    script = plan.sbatch_script or ""
    assert "#SBATCH --cpus-per-task=1" in script and "--gres" not in script
