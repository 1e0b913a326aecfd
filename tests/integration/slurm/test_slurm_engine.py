"""A serving engine on the SLURM launcher (issue 49): a deployment whose launcher is slurm is submitted by
the worker as a one-task job.sbatch in engines/<id>/, runs `python -m ftq.engine.serve` on the node SLURM
picked (bound to every address, with the node's name in its endpoint), and a stop scancels it. The engine
is the stand-in venv of tests/integration/worker/test_deployments.py: what is tested is the run around
it (the real vLLM engine is tests/e2e/serving's, on the local launcher)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from ftq.contract.status import JobStatus
from ftq.store.db import session_scope
from ftq.store.deployments import DeploymentRepository
from tests.harness import rows
from tests.integration.slurm.cluster import squeue_ids
from tests.integration.worker.test_deployments import add_deployment, dep, fake_venv, settle
from tests.integration.worker.test_reconcile import store

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
__all__ = ["fake_venv", "store"]  # the fixtures


def test_an_engine_runs_as_a_slurm_batch_job_and_is_stopped_by_scancel(
    slurm_cluster: list[str], store: Path, fake_venv: Path
) -> None:
    from worker import controller

    add_deployment("dep_slurm", launcher="slurm")
    controller.deployments_changed("dep_slurm")
    try:
        _run_and_stop(store)
    finally:  # a failed test leaves no batch job behind (a later one would adopt it by its name)
        subprocess.run(["scancel", "--name=ftq-dep_slurm"], check=False)


def _run_and_stop(store: Path) -> None:
    from worker import controller

    d = settle("dep_slurm", {"running"}, timeout=120)
    folder = store.parent / "engines" / "dep_slurm"
    script = (folder / "job.sbatch").read_text()
    assert "#SBATCH --job-name=ftq-dep_slurm" in script and "#SBATCH --ntasks=1" in script
    assert "-m ftq.engine.serve" in script and "--gres" not in script  # a CPU engine
    assert d.external_id and d.external_id.isdigit() and not d.resources  # SLURM holds its devices
    deadline = time.monotonic() + 120
    while not (folder / "endpoint.json").exists():
        assert time.monotonic() < deadline, (folder / "train.log").read_text()
        time.sleep(0.2)
    url = json.loads((folder / "endpoint.json").read_text())["url"]
    assert url.startswith(f"http://{socket.getfqdn()}:") and url.endswith("/v1")
    assert d.external_id in squeue_ids()

    with session_scope() as s:
        assert DeploymentRepository(s, rows.OWNER).request_cancel("dep_slurm") == JobStatus.cancelling
        s.commit()
    controller.deployments_changed("dep_slurm")
    ended = settle("dep_slurm", {"cancelled"}, timeout=120)
    assert ended.finished_at is not None and d.external_id not in squeue_ids()
    assert dep("dep_slurm").status == "cancelled"
