"""ftq end to end on the SLURM launcher: `ftq up`, POST /jobs with resources.launcher: slurm, the
worker submits job.sbatch, the trainer runs under srun on the test cluster, and the API reports it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.harness import Deployment, Job, no_text_field_folder, procs_with
from tests.harness import wait_until as wait_for
from tests.integration.slurm.cluster import slurm_spec, squeue_ids

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_jobs_on_slurm_succeed_fail_and_cancel(
    slurm_stack: Deployment, slurm_succeeding: Job, tiny_dir: Path
) -> None:
    stack, good = slurm_stack, slurm_succeeding
    long = stack.post_job(slurm_spec(tiny_dir, max_steps=100_000, name="slurm-long"))
    bad_spec = slurm_spec(tiny_dir, max_steps=4, name="slurm-bad")
    bad_spec["dataset"]["name_or_path"] = str(no_text_field_folder(stack.data_dir))
    bad = stack.post_job(bad_spec)
    assert good["launcher"] == "slurm"

    # The long one is paused mid-training (scancel: its ranks checkpoint and end, the batch job leaves
    # the cluster), resumed (a new batch job continues from that checkpoint), then cancelled once its new
    # launch has started.
    running = stack.wait_for(long["id"], lambda j: j["status"] == "running", 120, "running")
    first_slurm_id = running["external_id"]
    assert first_slurm_id and first_slurm_id.isdigit()
    metrics = stack.run_dir(long["id"]) / "metrics.jsonl"
    wait_for(
        "a few trained steps", lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 3, 180
    )
    assert stack.http.post(f"/jobs/{long['id']}/pause").status_code == 202
    paused = stack.wait_for(long["id"], lambda j: j["status"] == "paused", 120, "paused")
    assert first_slurm_id not in squeue_ids(), stack.report(long["id"])
    ckpts = stack.http.get(f"/jobs/{long['id']}/checkpoints").json()["data"]
    assert ckpts and ckpts[-1]["resumable"] and ckpts[-1]["step"] == paused["progress"]["step"], ckpts
    assert stack.http.post(f"/jobs/{long['id']}/resume").status_code == 202
    running = stack.wait_for(
        long["id"], lambda j: j["status"] == "running" and j["external_id"] != first_slurm_id, 120, "resumed"
    )
    slurm_id = running["external_id"]
    assert slurm_id and slurm_id.isdigit()
    run_dir = str(stack.run_dir(long["id"]))
    ckpt_dir = stack.run_dir(long["id"]) / "checkpoints" / f"checkpoint-{ckpts[-1]['step']}"
    resumed_from = f"resuming from {ckpt_dir}"
    wait_for(
        "the resumed run to load its checkpoint", lambda: resumed_from in stack.train_log(long["id"]), 180
    )
    assert slurm_id in squeue_ids("--states=RUNNING")
    r = stack.http.post(f"/jobs/{long['id']}/cancel")
    assert r.status_code == 202, r.text

    done = stack.wait_terminal(good["id"], timeout=240)
    assert done["status"] == "succeeded", stack.report(good["id"])
    assert done["external_id"] and done["external_id"].isdigit() and done["launcher"] == "slurm"
    plan = stack.http.get(f"/jobs/{good['id']}/plan").json()
    assert plan["sbatch_script"].startswith("#!/bin/bash\n#SBATCH ")
    assert (stack.run_dir(good["id"]) / "job.sbatch").read_text() == plan["sbatch_script"]
    points = stack.http.get(f"/jobs/{good['id']}/metrics").json()["data"]
    assert [p["step"] for p in points] == [1, 2, 3, 4] and all(p["loss"] is not None for p in points)
    assert (stack.run_dir(good["id"]) / "exit_status").read_text().strip() == "0"

    cancelled = stack.wait_terminal(long["id"], timeout=120)
    assert cancelled["status"] == "cancelled", stack.report(long["id"])
    assert cancelled["error"] is None
    assert slurm_id not in squeue_ids()
    wait_for("the cancelled job's processes to be gone", lambda: not procs_with(run_dir), timeout=30)

    failed = stack.wait_terminal(bad["id"], timeout=240)
    assert failed["status"] == "failed", failed
    assert failed["error"]["code"] == "dataset_error", failed["error"]
    assert failed["error"]["exit_code"] not in (None, 0)
    assert failed["external_id"] and failed["external_id"].isdigit()
    # All three ran as SLURM jobs; none is left on the cluster.
    assert not {good["external_id"], slurm_id, failed["external_id"]} & squeue_ids()


def test_a_job_warned_of_its_time_limit_checkpoints_is_requeued_and_resumes(
    slurm_stack: Deployment, tiny_dir: Path
) -> None:
    """requeue_on_timeout end to end: SLURM's warning before the time limit (what `--signal=B:USR1@<grace>`
    sends, here sent at once with `scancel --signal=USR1 --batch`, the same signal to the same batch shell,
    instead of waiting out a time limit) reaches the trainer through job.sbatch and srun; it checkpoints
    after its current step and exits; the worker queues the job again, and its new batch job resumes from
    that checkpoint and finishes. metrics.jsonl holds every step once, in order."""
    stack = slurm_stack
    spec = slurm_spec(tiny_dir, max_steps=40, name="slurm-timeout")
    spec["resources"]["slurm"]["requeue_on_timeout"] = True
    job = stack.post_job(spec)
    running = stack.wait_for(job["id"], lambda j: j["status"] == "running", 120, "running")
    first_slurm_id = running["external_id"]
    run_dir = stack.run_dir(job["id"])
    assert "#SBATCH --signal=B:USR1@" in (run_dir / "job.sbatch").read_text()
    metrics = run_dir / "metrics.jsonl"
    wait_for(
        "a few trained steps", lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 3, 120
    )
    subprocess.run(["scancel", "--signal=USR1", "--batch", first_slurm_id], check=True, timeout=30)

    done = stack.wait_terminal(job["id"], timeout=300)
    assert done["status"] == "succeeded", stack.report(job["id"])
    assert done["external_id"] != first_slurm_id  # a second batch job ran the rest
    log = stack.train_log(job["id"])
    stopped = re.search(r"ftq-error: time_limit: stopped after step (\d+) because", log)
    assert stopped, stack.report(job["id"])
    stopped_at = int(stopped.group(1))
    assert 3 <= stopped_at < 40
    assert f"resuming from {run_dir / 'checkpoints' / f'checkpoint-{stopped_at}'}" in log
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, 41)), steps  # continuous: nothing lost, nothing repeated
    points = stack.http.get(f"/jobs/{job['id']}/metrics", params={"limit": 1000}).json()["data"]
    assert [p["step"] for p in points] == list(range(1, 41))
    assert (run_dir / "exit_status.attempt0").read_text().strip() not in ("", "0")
    assert (run_dir / "final" / "adapter_model.safetensors").is_file()
