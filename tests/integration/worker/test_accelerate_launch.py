"""One real 2-process `accelerate launch` on the CPU, the rendered command with a probe script in place of
the trainer: both ranks join one process group of the rendered kind (the launch checks and plugins of
every other combination are run in process in tests/unit/ftq/planning/test_render.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ftq.planning.render import render_plan
from tests.unit.ftq.planning.test_render import settings, spec_for

PROBE = """
import json, os, sys
import torch.distributed as dist
from accelerate import Accelerator
acc = Accelerator(cpu=True)  # what the trainer does for device cpu (TrainingArguments use_cpu)
t = __import__("torch").tensor([acc.process_index + 1.0])
dist.all_reduce(t)
plugin = None
if os.environ.get("ACCELERATE_USE_FSDP") == "true":
    from accelerate.utils import FullyShardedDataParallelPlugin
    plugin = FullyShardedDataParallelPlugin().fsdp_version
elif os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":
    from accelerate.utils import DeepSpeedPlugin
    plugin = DeepSpeedPlugin().zero_stage
with open(os.path.join(sys.argv[1], f"rank{acc.process_index}.json"), "w") as f:
    json.dump({"rank": acc.process_index, "world": acc.num_processes, "sum": t.item(),
               "type": str(acc.distributed_type), "plugin": plugin}, f)
acc.wait_for_everyone()
dist.destroy_process_group()  # as the trainer does: teardown at exit can SIGABRT a rank
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dist", "plugin"),
    # The shipped Llama example's form. DDP and DeepSpeed take the same torchrun path (their launch
    # checks and plugins are covered in process above); one real launch keeps this test's time down.
    [({"strategy": "fsdp", "fsdp": {"version": 2}}, 2)],
    ids=["fsdp2"],
)
def test_real_two_process_cpu_launch(dist: dict[str, Any], plugin: int | None, tmp_path: Path) -> None:
    spec = spec_for(
        distributed=dist,
        training={"max_steps": 1, "mixed_precision": "no"},
        resources={"device": "cpu", "processes_per_node": 2},
    )
    plan = render_plan(spec, job_id=tmp_path.name, run_dir=tmp_path, settings=settings(python=sys.executable))
    (tmp_path / "accelerate_config.yaml").write_text(plan.accelerate_config_yaml)
    (tmp_path / "probe.py").write_text(PROBE)
    # The rendered launch, with a probe script in place of `-m trainer ...`.
    argv = [*plan.command[: plan.command.index("-m", 3)], str(tmp_path / "probe.py"), str(tmp_path)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in (0, 1)]
    assert [x["rank"] for x in results] == [0, 1]
    assert all(
        x["world"] == 2 and x["sum"] == 3.0 and x["type"] == "DistributedType.MULTI_CPU" for x in results
    )
    assert all(x["plugin"] == plugin for x in results)
