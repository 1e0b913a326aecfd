"""An export on the SLURM launcher: the job ran as a batch job, and so does its export (a one-task
job.sbatch in exports/<id>/ of the run directory, submitted by the worker), whose merged folder loads."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import EXAMPLES, QUICK_SETTINGS, Deployment, example_spec
from tests.integration.slurm.cluster import squeue_ids

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def stack(
    slurm_cluster: list[str], tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("ftq-slurm-export")
    dep = Deployment(root, settings={**QUICK_SETTINGS, "local_roots": f"{EXAMPLES}:{root / 'data'}"})
    try:
        with dep:
            yield dep
    finally:
        records = list((dep.data_dir / "runs").glob("*/launch.json"))
        records += list((dep.data_dir / "runs").glob("*/exports/*/launch.json"))
        ids = [str(json.loads(p.read_text()).get("external_id") or "") for p in records]
        if any(ids):
            subprocess.run(["scancel", *[i for i in ids if i]], capture_output=True, check=False)


def test_a_merged_export_runs_as_a_slurm_batch_job(stack: Deployment, tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    spec = example_spec("tiny-cpu.yaml", max_steps=3, logging_steps=1, save_steps=None, eval_steps=None)
    spec["name"] = "slurm-export"
    spec["dataset"]["name_or_path"] = str(tiny_dir / "data" / "train.jsonl")
    spec["dataset"]["eval_split"] = None
    spec["resources"].update({"launcher": "slurm", "device": "cpu"})
    spec["resources"].setdefault("slurm", {})["time_limit"] = "00:10:00"
    job = stack.post_job(spec)
    done = stack.wait_terminal(job["id"], timeout=300)
    assert done["status"] == "succeeded", stack.report(job["id"])

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
