"""Which queued jobs start now: first come, first served per resource pool (pure functions, no I/O).

Local CUDA jobs take `processes_per_node` GPUs out of FTQ_GPU_POOL, disjoint from every other job's;
local CPU jobs take `processes_per_node` of FTQ_CPU_SLOTS. Within a pool the oldest queued job goes
first: once it has to wait, later jobs of that pool wait too (no starvation of big jobs). SLURM jobs
take nothing here; SLURM queues them itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ftq import limits
from ftq.settings import Settings


@dataclass(frozen=True)
class Need:
    pool: str | None  # "gpus", "cpu_slots", or None (nothing held locally)
    count: int


@dataclass(frozen=True)
class Decision:
    job_id: str
    resources: dict[str, Any] | None = None  # start with these
    impossible: str | None = None  # can never start here: the reason


def need_of(spec: dict[str, Any]) -> Need:
    res = spec.get("resources") or {}
    if res.get("launcher", "local") != "local":
        return Need(None, 0)
    count = int(res.get("processes_per_node", 1)) * int(res.get("num_nodes", 1))
    return Need("gpus" if res.get("device", "cuda") == "cuda" else "cpu_slots", count)


def free_resources(settings: Settings, held: list[dict[str, Any]]) -> tuple[list[int], int]:
    used_gpus = {int(g) for r in held for g in (r.get("gpus") or [])}
    used_slots = sum(int(r.get("cpu_slots") or 0) for r in held)
    gpus = [g for g in settings.gpu_indices if g not in used_gpus]
    return gpus, max(0, settings.cpu_slots - used_slots)


def decide(
    queued: list[tuple[str, dict[str, Any]]], held: list[dict[str, Any]], settings: Settings
) -> list[Decision]:
    """`queued` is (job id, spec) oldest first. Returns the jobs to start (with what they get) and the
    jobs that can never start on this worker; every other job stays queued."""
    free_gpus, free_slots = free_resources(settings, held)
    blocked: set[str] = set()
    out: list[Decision] = []
    for job_id, spec in queued:
        need = need_of(spec)
        if need.pool is None:
            out.append(Decision(job_id, resources={}))
            continue
        beyond = limits.beyond_local_pool("cuda" if need.pool == "gpus" else "cpu", need.count, settings)
        if beyond is not None:
            out.append(Decision(job_id, impossible=beyond[1]))
            continue
        if need.pool == "gpus":
            if "gpus" in blocked or need.count > len(free_gpus):
                blocked.add("gpus")
                continue
            take, free_gpus = free_gpus[: need.count], free_gpus[need.count :]
            out.append(Decision(job_id, resources={"gpus": take}))
        else:
            if "cpu_slots" in blocked or need.count > free_slots:
                blocked.add("cpu_slots")
                continue
            free_slots -= need.count
            out.append(Decision(job_id, resources={"cpu_slots": need.count}))
    return out
