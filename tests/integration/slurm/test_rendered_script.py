"""The rendered job.sbatch on the real 2-node cluster, with a stand-in interpreter that records its argv.

What it proves: one `accelerate launch` per node with that node's rank expanded on the node, MASTER_ADDR
from `scontrol show hostnames`, exit_status written, and a requeued job (what preemption does) restarted
with `--resume_from_checkpoint latest` once a checkpoint exists.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from ftq.contract.spec import JobSpec
from ftq.planning.render import render_plan
from ftq.runtime.settings import Settings
from tests.harness import wait_until as wait_for
from tests.integration.slurm.cluster import poll_one, submit, wait_phase
from tests.integration.worker.test_launch_scripts import argv_file, fake_python
from tests.unit.ftq.planning.test_render import settings as render_settings
from tests.unit.ftq.planning.test_render import spec_for
from worker.launchers.base import RunPhase

pytestmark = pytest.mark.slurm

# Stands in for python: records who ran it and with what; the first attempt waits to be requeued.
STUB = """#!/bin/bash
printf '%s restart=%s %s\\n' "$SLURMD_NODENAME" "${SLURM_RESTART_COUNT:-0}" "$*" >> "$(pwd)/argv.log"
if [ "${SLURM_RESTART_COUNT:-0}" -eq 0 ]; then exec sleep 300; fi
"""


def two_node_spec(tmp_path: Path) -> dict[str, Any]:
    return {
        "name": "rehearsal",
        "model": {"name_or_path": str(tmp_path / "model")},
        "dataset": {"name_or_path": str(tmp_path / "data.jsonl"), "text_field": "text"},
        "training": {"max_steps": 4, "mixed_precision": "no"},
        "distributed": {"strategy": "ddp"},
        "resources": {
            "launcher": "slurm",
            "device": "cpu",
            "num_nodes": 2,
            "processes_per_node": 1,
            "slurm": {"time_limit": "00:10:00"},
        },
    }


def argv_lines(run_dir: Path) -> list[str]:
    path = run_dir / "argv.log"
    return path.read_text().splitlines() if path.exists() else []


def test_requeued_job_resumes_from_latest_checkpoint(
    slurm_cluster: list[str], tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    assert len(slurm_cluster) >= 2, f"the rehearsal needs the 2-node test cluster, got {slurm_cluster}"
    stub = tmp_path / "python-stub"
    stub.write_text(STUB)
    stub.chmod(0o755)
    settings = Settings(data_dir=tmp_path / "data", env="test", python=str(stub))
    job_id = "rq" + tmp_path.name[-8:].replace("_", "")
    run_dir = settings.runs_dir / job_id
    spec = JobSpec.model_validate(two_node_spec(tmp_path))
    plan = render_plan(spec, job_id=job_id, run_dir=run_dir, settings=settings, main_process_port=29123)
    script = plan.sbatch_script
    assert script is not None and "SLURM_RESTART_COUNT" in script
    assert "--resume_from_checkpoint latest" in script

    launcher, ref = submit(settings, job_id, run_dir, spec, plan, cleanup_jobs)

    def both_launched() -> list[str] | None:
        lines = argv_lines(run_dir)
        return lines if len(lines) >= 2 else None

    first = wait_for("both nodes' launches", both_launched, timeout=60)
    ranks = {}
    for line in first:
        node, restart, *argv = line.split()
        assert restart == "restart=0"
        assert argv[:2] == ["-m", "accelerate.commands.launch"]
        ranks[node] = argv[argv.index("--machine_rank") + 1]
        assert argv[argv.index("--main_process_ip") + 1] == slurm_cluster[0]
        assert argv[argv.index("--main_process_port") + 1] == "29123"
        assert argv[argv.index("--num_machines") + 1] == "2"
        assert "--resume_from_checkpoint" not in argv
    assert sorted(ranks.values()) == ["0", "1"] and len(ranks) == 2, first
    assert poll_one(launcher, ref).phase == RunPhase.running

    # A checkpoint exists, then SLURM requeues the job (as preemption with PreemptMode=REQUEUE does).
    (run_dir / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    subprocess.run(["scontrol", "requeue", str(ref.external_id)], check=True)
    state = wait_phase(launcher, ref, {RunPhase.pending}, timeout=60)
    assert state.requeued
    # SLURM holds a requeued job back for a while (BeginTime); let it start now.
    subprocess.run(["scontrol", "update", f"JobId={ref.external_id}", "StartTime=now"], check=True)

    state = wait_phase(launcher, ref, {RunPhase.exited, RunPhase.lost}, timeout=90)
    assert state.phase == RunPhase.exited and state.exit_code == 0, state
    second = argv_lines(run_dir)[len(first) :]
    assert len(second) == 2, argv_lines(run_dir)
    for line in second:
        node, restart, *argv = line.split()
        assert restart == "restart=1"
        assert argv[-2:] == ["--resume_from_checkpoint", "latest"], argv
    assert (run_dir / "exit_status").read_text().strip() == "0"
    log = (run_dir / "train.log").read_text()
    assert "DUE TO JOB REQUEUE" in log


def test_sbatch_script_under_real_slurm(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The rendered script through real sbatch and srun on the CI's two-node cluster: both nodes launch with
    their own machine rank, and the exit status file appears."""
    base = tmp_path_factory.mktemp("slurm")
    run_dir = base / "run dir #1"
    run_dir.mkdir(parents=True)
    spec = spec_for(
        distributed={"strategy": "ddp"},
        resources={
            "launcher": "slurm",
            "device": "cpu",
            "num_nodes": 2,
            "processes_per_node": 1,
            "slurm": {"time_limit": "5"},
        },
    )
    plan = render_plan(
        spec,
        job_id="render-test",
        run_dir=run_dir,
        settings=render_settings(python=str(fake_python(base)), slurm_partition=None, slurm_setup=""),
    )
    assert plan.sbatch_script is not None
    (run_dir / "job.sbatch").write_text(plan.sbatch_script)
    r = subprocess.run(
        ["sbatch", "--parsable", "--wait", str(run_dir / "job.sbatch")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr + (run_dir / "train.log").read_text(errors="replace")
    assert (run_dir / "exit_status").read_text() == "0\n"
    ranks = sorted(argv_file(p)[3] for p in run_dir.glob("argv.*.bin"))
    assert ranks == ["0", "1"]
    assert "fake launch started on 0" in (run_dir / "train.log").read_text()
