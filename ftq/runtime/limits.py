"""How long a job may run: the operator's cap (FTQ_MAX_TIME_LIMIT_HOURS) and a SLURM time limit in
seconds. The API refuses a `resources.slurm.time_limit` beyond the cap; a local job has no scheduler to
stop it, so the worker stops one that runs longer than the cap, as SLURM stops a batch job at its --time."""

from __future__ import annotations

from ftq.runtime.settings import Settings


def slurm_time_seconds(value: str) -> int:
    """SLURM's --time forms (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in seconds; a ValueError otherwise."""
    days = 0
    rest = value.strip()
    if "-" in rest:
        d, rest = rest.split("-", 1)
        days = int(d)
        # After a day count, the first field is hours: D-H, D-H:M, D-H:M:S.
        parts = [int(p) for p in rest.split(":")]
        if not 1 <= len(parts) <= 3:
            raise ValueError(f"not a SLURM time: {value!r}")
        h, m, s = [*parts, 0, 0][:3]
    else:
        parts = [int(p) for p in rest.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        elif len(parts) == 3:
            h, m, s = parts
        else:
            raise ValueError(f"not a SLURM time: {value!r}")
    return ((days * 24 + h) * 60 + m) * 60 + s


def max_seconds(settings: Settings) -> int:
    """The operator's cap on a job's time limit, and how long a local job may run."""
    return int(settings.max_time_limit_hours * 3600)


def beyond_local_pool(device: str, processes: int, settings: Settings) -> tuple[str, str] | None:
    """Why a local job of `processes` ranks can never start on this server's worker pool (FTQ_GPU_POOL
    for cuda, FTQ_CPU_SLOTS for cpu), as (the resources field to change, the reason with its fix); None
    when it fits. The API refuses such a job at submit; the worker fails one that got queued anyway
    (submitted before the operator shrank the pool)."""
    if device == "cuda":
        have = len(settings.gpu_indices)
        if processes <= have:
            return None
        pool = f"FTQ_GPU_POOL={settings.gpu_pool!r}"
        if have == 0:
            return (
                "device",
                f"this server's local worker pool has no GPUs ({pool}); use device: cpu, or launcher: slurm",
            )
        return (
            "processes_per_node",
            f"the job needs {processes} GPUs but this server's local worker pool has {have} ({pool}); "
            f"set processes_per_node to at most {have}, use device: cpu, or launcher: slurm",
        )
    have = settings.cpu_slots
    if processes <= have:
        return None
    return (
        "processes_per_node",
        f"the job needs {processes} CPU processes but this server's local worker allows {have} "
        f"(FTQ_CPU_SLOTS); set processes_per_node to at most {have}",
    )
