"""How long a job may run: the operator's cap (FTQ_MAX_TIME_LIMIT_HOURS) and a SLURM time limit in
seconds. The API refuses a `resources.slurm.time_limit` beyond the cap; a local job has no scheduler to
stop it, so the worker stops one that runs longer than the cap, as SLURM stops a batch job at its --time."""

from __future__ import annotations

from ftq.settings import Settings


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
