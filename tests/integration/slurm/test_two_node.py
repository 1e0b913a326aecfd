"""A 2-node launch rehearsed on one machine: the rendered job.sbatch, two slurmd "nodes", real
`accelerate launch` with static rendezvous on CPU, and a probe in place of the trainer that joins the
process group and all-reduces across both machines.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ftq.contract.spec import JobSpec
from ftq.planning.render import render_plan
from ftq.runtime.settings import Settings
from tests.integration.slurm.cluster import submit, wait_phase
from worker.launchers.base import RunPhase

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PROCESSES_PER_NODE = 2

# Runs where the trainer would: same launcher, same config, same rendezvous.
PROBE = """
import json, os, socket, sys
import torch
import torch.distributed as dist
from accelerate import Accelerator

acc = Accelerator(cpu=True)
rank = acc.process_index
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
where = [None] * acc.num_processes
dist.all_gather_object(where, (os.environ.get("SLURMD_NODENAME"), int(os.environ.get("GROUP_RANK", -1))))
out = sys.argv[sys.argv.index("--output_dir") + 1]
with open(os.path.join(out, f"probe-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "num_processes": acc.num_processes, "world_size": dist.get_world_size(),
               "backend": dist.get_backend(), "distributed_type": str(acc.distributed_type),
               "local_rank": acc.local_process_index, "all_reduce": total.item(), "where": where}, f)
acc.wait_for_everyone()
# As the trainer does: left to interpreter shutdown, a rank's gloo threads can be torn down mid-flight
# ("terminate called without an active exception", SIGABRT) and the launch fails after its work is done.
dist.destroy_process_group()
"""

# Takes the interpreter's place in the rendered script: swaps `-m trainer` for the probe, runs the rest as is.
WRAPPER = """#!/bin/bash
args=()
while [ $# -gt 0 ]; do
  if [ "$1" = "-m" ] && [ "${2:-}" = "trainer" ]; then args+=("@PROBE@"); shift 2
  else args+=("$1"); shift; fi
done
exec @PYTHON@ "${args[@]}"
"""


def test_two_machines_form_one_process_group(
    slurm_cluster: list[str], tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    assert len(slurm_cluster) >= 2, f"the rehearsal needs the 2-node test cluster, got {slurm_cluster}"
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    wrapper = tmp_path / "python"
    wrapper.write_text(WRAPPER.replace("@PROBE@", str(probe)).replace("@PYTHON@", sys.executable))
    wrapper.chmod(0o755)
    settings = Settings(data_dir=tmp_path / "data", env="test", python=str(wrapper))
    job_id = "twonode"
    run_dir = settings.runs_dir / job_id
    spec = JobSpec.model_validate(
        {
            "model": {"name_or_path": str(tmp_path / "model")},
            "dataset": {"name_or_path": str(tmp_path / "data.jsonl"), "text_field": "text"},
            "training": {"max_steps": 1, "mixed_precision": "no"},
            "distributed": {"strategy": "ddp"},
            "resources": {
                "launcher": "slurm",
                "device": "cpu",
                "num_nodes": 2,
                "processes_per_node": PROCESSES_PER_NODE,
            },
        }
    )
    plan = render_plan(spec, job_id=job_id, run_dir=run_dir, settings=settings)
    run_dir.mkdir(parents=True)
    (run_dir / "accelerate_config.yaml").write_text(plan.accelerate_config_yaml)

    launcher, ref = submit(settings, job_id, run_dir, spec, plan, cleanup_jobs)
    state = wait_phase(launcher, ref, {RunPhase.exited, RunPhase.lost}, timeout=150)
    log = (run_dir / "train.log").read_text(errors="replace")
    assert state.phase == RunPhase.exited and state.exit_code == 0, f"{state}\n{log[-4000:]}"

    world = 2 * PROCESSES_PER_NODE
    results = [json.loads((run_dir / f"probe-{r}.json").read_text()) for r in range(world)]
    expected_sum = sum(range(1, world + 1))
    for res in results:
        assert res["num_processes"] == res["world_size"] == world, res
        assert res["backend"] == "gloo" and res["all_reduce"] == expected_sum, res
    where = results[0]["where"]
    assert all(r["where"] == where for r in results)
    # Two slurmd "nodes", each one machine rank holding PROCESSES_PER_NODE processes.
    nodes = {node for node, _ in where}
    machines = {machine for _, machine in where}
    assert nodes == set(slurm_cluster[:2]) and machines == {0, 1}, where
    for machine in machines:
        assert [m for _, m in where].count(machine) == PROCESSES_PER_NODE, where
