"""Which queued jobs start, on which GPUs or CPU slots (worker/scheduling.py): first come, first served."""

from __future__ import annotations

from typing import Any

from ftq.settings import Settings
from worker import scheduling


def spec(device: str = "cpu", procs: int = 1, launcher: str = "local") -> dict[str, Any]:
    res = {"launcher": launcher, "device": device, "processes_per_node": procs, "num_nodes": 1}
    return {"resources": res}


def test_gpus_are_disjoint_and_jobs_wait_first_come_first_served() -> None:
    s = Settings(gpu_pool="0,1,2,3", cpu_slots=2)
    held: list[dict[str, Any]] = [{"gpus": [1]}, {"cpu_slots": 1}]
    queued: list[tuple[str, dict[str, Any]]] = [
        ("a", spec("cuda", 2)),
        ("b", spec("cuda", 2)),
        ("c", spec("cuda", 1)),
        ("d", spec("cpu", 1)),
        ("e", spec("cpu", 1)),
        ("f", spec(launcher="slurm", device="cuda", procs=8)),
    ]
    out = {d.job_id: d for d in scheduling.decide(queued, held, s)}
    assert out["a"].resources == {"gpus": [0, 2]}
    # b does not fit in the one GPU left; c, although it would fit, waits behind b (no starvation).
    assert "b" not in out and "c" not in out
    assert out["d"].resources == {"cpu_slots": 1} and "e" not in out
    assert out["f"].resources == {}


def test_a_job_larger_than_the_pool_is_refused_with_the_reason() -> None:
    out = scheduling.decide([("big", spec("cuda", 8))], [], Settings(gpu_pool="0,1"))
    assert out[0].impossible and "needs 8 GPUs" in out[0].impossible and "FTQ_GPU_POOL" in out[0].impossible
    out = scheduling.decide([("cpu", spec("cpu", 3))], [], Settings(cpu_slots=2))
    assert out[0].impossible and "FTQ_CPU_SLOTS" in out[0].impossible
