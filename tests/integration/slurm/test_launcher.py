"""SlurmLauncher on the real cluster: submit, poll to the end, cancel, and the end after squeue forgets."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from ftq.contract.runs import LAUNCH_RECORD
from tests.harness import procs_with
from tests.harness import wait_until as wait_for
from tests.harness.launching import launch_request
from tests.integration.slurm.cluster import poll_one, squeue_ids, wait_phase
from worker.launchers.base import RunPhase, RunRef
from worker.launchers.slurm import SlurmError, SlurmLauncher

pytestmark = pytest.mark.slurm


def batch_script(run_dir: Path, body: str, extra: str = "") -> str:
    """A batch script shaped like job.sbatch: output to train.log, exit status recorded by an EXIT trap."""
    return f"""#!/bin/bash
#SBATCH --job-name=ftq-{run_dir.name}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --chdir={run_dir}
#SBATCH --output={run_dir}/train.log
#SBATCH --open-mode=append
{extra}
set -euo pipefail
trap 'printf "%s\\n" $? > .exit_status.tmp && mv -f .exit_status.tmp exit_status' EXIT
trap 'echo "got SIGTERM" >&2' TERM
{body}
"""


def submit(
    launcher: SlurmLauncher,
    tmp_path: Path,
    name: str,
    body: str,
    cleanup: list[str],
    extra: str = "",
    env: dict[str, str] | None = None,
) -> RunRef:
    run_dir = tmp_path / f"{name}-{uuid.uuid4().hex[:6]}"
    req = launch_request(run_dir.name, run_dir, sbatch_script=batch_script(run_dir, body, extra), env=env)
    handle = launcher.submit(req)
    assert handle.external_id and handle.external_id.isdigit()
    cleanup.append(handle.external_id)
    return RunRef(req.job_id, run_dir, handle.external_id, None, None)


def test_job_runs_to_exit_zero_with_env_not_in_script(
    launcher: SlurmLauncher, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    ref = submit(
        launcher,
        tmp_path,
        "ok",
        'echo "hello from $SLURMD_NODENAME secret=$FTQ_TEST_SECRET"',
        cleanup_jobs,
        env={"FTQ_TEST_SECRET": "s3cr3t-value"},
    )
    assert (ref.run_dir / "job.sbatch").is_file()
    assert "s3cr3t-value" not in (ref.run_dir / "job.sbatch").read_text()
    state = wait_phase(launcher, ref, {RunPhase.exited, RunPhase.lost}, timeout=60)
    assert state.phase == RunPhase.exited and state.exit_code == 0 and state.reason is None, state
    log = (ref.run_dir / "train.log").read_text()
    assert "hello from " in log and "secret=s3cr3t-value" in log
    assert (ref.run_dir / "exit_status").read_text().strip() == "0"


def test_failing_job_gives_its_exit_code(
    launcher: SlurmLauncher, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    ref = submit(launcher, tmp_path, "fail", "echo failing; exit 7", cleanup_jobs)
    state = wait_phase(launcher, ref, {RunPhase.exited, RunPhase.lost}, timeout=60)
    assert (state.phase, state.exit_code, state.reason) == (RunPhase.exited, 7, None), state


def test_cancel_stops_the_job_and_its_processes_then_the_end_outlives_squeue(
    launcher: SlurmLauncher, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    marker = f"ftq-sleep-marker-{uuid.uuid4().hex[:8]}"
    # `exec -a` names the sleeper so its process can be found; srun makes it a job step, as training is.
    long = submit(launcher, tmp_path, "long", f"srun bash -c 'exec -a {marker} sleep 600'", cleanup_jobs)
    failed = submit(launcher, tmp_path, "fail", "exit 5", cleanup_jobs)
    wait_for("the sleeper to start", lambda: procs_with(marker), timeout=60)
    assert poll_one(launcher, long).phase == RunPhase.running

    launcher.cancel(long)
    assert (long.run_dir / "cancel.json").is_file()
    launcher.cancel(long)  # reconcile repeats it every sweep: recorded, so SLURM is not asked again
    state = wait_phase(launcher, long, {RunPhase.exited, RunPhase.lost}, timeout=60)
    assert state.phase == RunPhase.exited and state.reason == "CANCELLED", state
    assert long.external_id not in squeue_ids()  # default states: pending, running, completing
    wait_for("the job's processes to be gone", lambda: not procs_with(marker), timeout=30)
    (long.run_dir / "cancel.json").unlink()
    launcher.cancel(long)  # scancel of an ended job: no error, nothing changes
    assert poll_one(launcher, long).reason == "CANCELLED"

    # With MinJobAge=5 the controller forgets ended jobs within seconds (no accounting on this cluster):
    # the launcher then reads exit_status and, for the reason, slurmstepd's line in train.log.
    ids = {long.external_id, failed.external_id}
    wait_for("both jobs to leave squeue", lambda: not (ids & squeue_ids("--states=all")), timeout=90, every=1)
    states = launcher.poll([long, failed])
    assert states[failed.job_id].phase == RunPhase.exited and states[failed.job_id].exit_code == 5
    cancelled = states[long.job_id]
    assert cancelled.phase == RunPhase.exited and cancelled.reason == "CANCELLED", cancelled
    assert cancelled.exit_code not in (None, 0)
    # sacct was asked once, found accounting off, and is not asked again.
    assert launcher._sacct_ok is False


def test_unknown_job_without_exit_status_is_lost(launcher: SlurmLauncher, tmp_path: Path) -> None:
    (tmp_path / "gone").mkdir()
    ref = RunRef("gone", tmp_path / "gone", "987654", None, None)
    assert poll_one(launcher, ref).phase == RunPhase.lost
    launcher.cancel(ref)  # no such job: nothing to do, no error


def test_find_recovers_an_unrecorded_submission(
    launcher: SlurmLauncher, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    ref = submit(launcher, tmp_path, "find", "sleep 60", cleanup_jobs)
    found = launcher.find(ref.run_dir)
    assert found is not None and found.external_id == ref.external_id
    (ref.run_dir / LAUNCH_RECORD).unlink()  # as if the worker died right after sbatch
    found = launcher.find(ref.run_dir)
    assert found is not None and found.external_id == ref.external_id
    launcher.cancel(ref)
    assert launcher.find(tmp_path / "never-submitted") is None


def test_sbatch_refusal_is_an_error(launcher: SlurmLauncher, tmp_path: Path) -> None:
    run_dir = tmp_path / "refused"
    script = batch_script(run_dir, "true", "#SBATCH --partition=no-such-part")
    req = launch_request("refused", run_dir, sbatch_script=script)
    with pytest.raises(SlurmError, match="sbatch refused"):
        launcher.submit(req)


def test_missing_commands_are_reported(tmp_path: Path) -> None:
    from ftq.runtime.settings import Settings

    launcher = SlurmLauncher(Settings(data_dir=tmp_path, slurm_bin_dir=str(tmp_path / "no-bin")))
    with pytest.raises(SlurmError, match="FTQ_SLURM_BIN_DIR"):
        launcher.poll([RunRef("x", tmp_path, "1", None, None)])
    good = SlurmLauncher(
        Settings(
            data_dir=tmp_path,
            slurm_bin_dir=str(
                Path(
                    subprocess.run(["which", "squeue"], capture_output=True, text=True).stdout.strip()
                ).parent
            ),
        )
    )
    assert good.bin("squeue").startswith("/")


def test_pending_reason_nice_and_the_runs_own_start_and_end(
    launcher: SlurmLauncher, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """While SLURM holds a job, poll gives SLURM's reason (the job's queue.reason) and a low priority's
    --nice is the job's; once it ran, its start and end by SLURM's clock (what its usage counts)."""
    later = submit(
        launcher,
        tmp_path,
        "later",
        "true",
        cleanup_jobs,
        extra="#SBATCH --begin=now+1hour\n#SBATCH --nice=100",
    )
    state = wait_phase(launcher, later, {RunPhase.pending}, timeout=30)
    assert state.pending_reason == "BeginTime" and state.started_at is None, state
    nice = subprocess.run(
        ["squeue", "-h", "-o", "%y", "-j", str(later.external_id)], capture_output=True, text=True
    )
    assert nice.stdout.strip() == "100", nice

    quick = submit(launcher, tmp_path, "quick", "sleep 2", cleanup_jobs)
    state = wait_phase(launcher, quick, {RunPhase.exited, RunPhase.lost}, timeout=60)
    assert state.phase == RunPhase.exited and state.exit_code == 0, state
    assert state.started_at is not None and state.ended_at is not None, state
    assert 1 <= state.ended_at - state.started_at <= 30, state
