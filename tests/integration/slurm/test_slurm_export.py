"""An export on the SLURM launcher: the job ran as a batch job (conftest.py `slurm_succeeding`), and so
does its export (a one-task job.sbatch in exports/<id>/ of the run directory, submitted by the worker),
whose merged folder loads."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from tests.harness import Deployment, Job
from tests.integration.slurm.cluster import squeue_ids

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_a_merged_export_runs_as_a_slurm_batch_job(slurm_stack: Deployment, slurm_succeeding: Job) -> None:
    from transformers import AutoModelForCausalLM

    stack, job = slurm_stack, slurm_succeeding
    done = stack.wait_terminal(job["id"], timeout=300)
    assert done["status"] == "succeeded" and done["launcher"] == "slurm", stack.report(job["id"])

    r = stack.http.post(f"/jobs/{job['id']}/exports", json={"kind": "merged", "dtype": "bf16"})
    assert r.status_code == 202, r.text
    eid = r.json()["id"]
    export: dict[str, Any] = {}
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        export = stack.http.get(f"/jobs/{job['id']}/exports/{eid}").json()
        if export["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.5)
    folder = stack.run_dir(job["id"]) / export["path"]
    log = (folder / "train.log").read_text() if (folder / "train.log").exists() else ""
    queue = subprocess.run(["squeue", "--states=all"], capture_output=True, text=True, check=False).stdout
    assert export["status"] == "succeeded", f"{export}\n{log}\n{queue}"
    script = (folder / "job.sbatch").read_text()
    assert "#SBATCH --job-name=ftq-" + eid in script and "#SBATCH --ntasks=1" in script
    slurm_id = json.loads((folder / "launch.json").read_text())["external_id"]
    assert slurm_id.isdigit() and slurm_id not in squeue_ids()
    assert (folder / "exit_status").read_text().strip() == "0"
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    assert str(model.dtype) == "torch.bfloat16"
