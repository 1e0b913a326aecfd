"""Which queued jobs start now, and for every other one its place, why it waits and when it should start
(pure functions, no I/O: `decide` takes rows and numbers, and returns decisions).

Pools. Local CUDA jobs take `processes_per_node` GPUs out of FTQ_GPU_POOL, disjoint from every other
job's; local CPU jobs take `processes_per_node` of FTQ_CPU_SLOTS. SLURM jobs take nothing here: SLURM
queues them itself (priority becomes --nice / QOS in job.sbatch), so they start at once.

Order within a pool (the rank):
1. `priority`: high, then normal, then low.
2. Fair share among equal priorities: the owner whose score is lowest goes first. The score is the
   devices of this pool the owner holds now plus their recent usage (device-seconds of finished runs,
   halved every FTQ_FAIR_SHARE_HALF_LIFE_HOURS) divided by the half-life, i.e. devices now plus about the
   devices they held on average lately. Each job ranked adds its devices to its owner's score, so owners
   take turns rather than one owner's whole backlog going first.
3. The oldest job.

Backfill with one reservation per pool (EASY backfilling). Jobs start in rank order while they fit. The
first job that does not fit gets a reservation: the earliest time at which enough devices are free, from
the running jobs' expected ends (`expected_end`). A later-ranked job that fits the free devices still
starts if it cannot delay that reservation: it ends by its own time limit (`resources.max_seconds`) before
the reserved start, or it uses only devices that are free even after the reserved job has taken its
share. Otherwise it waits with the reason `reservation`. A reservation rests on the running jobs' expected
ends (`expected_end`: the trainer's ETA, else the plan's time estimate, and for a job past its estimate as
long again as it has run; never past its limit), so it holds exactly where those are limits, and is a best
estimate otherwise.

Quotas (operator settings). A job that would take its owner past their concurrent quota of a pool
(FTQ_QUOTA_GPUS, FTQ_QUOTA_CPU_SLOTS) waits with the reason `quota` (it is not counted against anyone's
reservation); one that asks for more than the quota alone can never start and fails with quota_exceeded.
An owner who has used their GPU hours of the current period (FTQ_QUOTA_GPU_HOURS) has their queued cuda
jobs fail with quota_exceeded: waiting would hold the queue for up to a whole period, and the message says
when the period ends.

Estimated starts simulate the queue in rank order on each pool's devices (list scheduling: a job starts
when its devices are free, and holds them for its expected duration).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from ftq.contract.errors import ErrorCode
from ftq.runtime import limits
from ftq.runtime.settings import Settings

GPUS = "gpus"
CPU_SLOTS = "cpu_slots"

# Why a queued job waits (the job's `queue.reason`).
NO_FREE_DEVICES = "no_free_devices"
RESERVATION = "reservation"
QUOTA = "quota"

PRIORITY_RANK = {"low": 0, "normal": 1, "high": 2}


@dataclass(frozen=True)
class Need:
    pool: str | None  # "gpus", "cpu_slots", or None (nothing held locally)
    count: int


def need_of(spec: dict[str, Any]) -> Need:
    res = spec.get("resources") or {}
    if res.get("launcher", "local") != "local":
        return Need(None, 0)
    count = int(res.get("processes_per_node", 1)) * int(res.get("num_nodes", 1))
    return Need(GPUS if res.get("device", "cuda") == "cuda" else CPU_SLOTS, count)


@dataclass(frozen=True)
class QueuedJob:
    id: str
    owner: str
    need: Need
    priority: str = "normal"
    seq: int = 0
    limit_seconds: float | None = None  # its own time limit (resources.max_seconds), if it set one
    estimate_seconds: float | None = None  # the plan's time estimate, if it has one

    @classmethod
    def from_spec(
        cls, job_id: str, owner: str, spec: dict[str, Any], *, seq: int = 0, estimate: float | None = None
    ) -> QueuedJob:
        res = spec.get("resources") or {}
        return cls(
            id=job_id,
            owner=owner,
            need=need_of(spec),
            priority=str(spec.get("priority") or "normal"),
            seq=seq,
            limit_seconds=res.get("max_seconds"),
            estimate_seconds=estimate,
        )


@dataclass(frozen=True)
class RunningJob:
    """A job holding devices now (starting, running or cancelling)."""

    id: str
    owner: str
    resources: dict[str, Any]  # {"gpus": [0, 1]} or {"cpu_slots": 2}
    started_at: float | None = None  # unix time; None: claimed, not launched yet
    limit_seconds: float | None = None
    estimate_seconds: float | None = None
    eta_seconds: float | None = None  # what the trainer's progress says is left

    @property
    def pool(self) -> str | None:
        if self.resources.get(GPUS):
            return GPUS
        if self.resources.get(CPU_SLOTS):
            return CPU_SLOTS
        return None

    @property
    def count(self) -> int:
        if self.resources.get(GPUS):
            return len(self.resources[GPUS])
        return int(self.resources.get(CPU_SLOTS) or 0)


@dataclass(frozen=True)
class Usage:
    """What owners used lately: decayed device-seconds (fair share), and GPU-seconds in this quota period."""

    recent_device_seconds: dict[str, float] = field(default_factory=dict)
    period_gpu_seconds: dict[str, float] = field(default_factory=dict)
    period_ends: float | None = None  # unix time the current quota period ends


@dataclass(frozen=True)
class Decision:
    job_id: str
    resources: dict[str, Any] | None = None  # start with these
    impossible: str | None = None  # can never start here (or not in this quota period): the reason
    error_code: str = ErrorCode.launch_error  # the code the job fails with when impossible


@dataclass(frozen=True)
class Waiting:
    job_id: str
    position: int  # 1 = next; over every waiting local job, in rank order
    reason: str  # no_free_devices | reservation | quota
    estimated_start: float | None  # unix time; None when it cannot be told


@dataclass
class Outcome:
    decisions: list[Decision] = field(default_factory=list)  # to start, or to fail
    waiting: list[Waiting] = field(default_factory=list)
    reservations: dict[str, tuple[str, float]] = field(default_factory=dict)  # pool -> (job id, start)

    @property
    def started(self) -> dict[str, dict[str, Any]]:
        return {d.job_id: d.resources for d in self.decisions if d.resources is not None}


def free_resources(settings: Settings, held: list[dict[str, Any]]) -> tuple[list[int], int]:
    used_gpus = {int(g) for r in held for g in (r.get(GPUS) or [])}
    used_slots = sum(int(r.get(CPU_SLOTS) or 0) for r in held)
    gpus = [g for g in settings.gpu_indices if g not in used_gpus]
    return gpus, max(0, settings.cpu_slots - used_slots)


def duration(limit: float | None, estimate: float | None, cap: float) -> float:
    """How long a job is expected to hold its devices: its estimate, never beyond its own limit (or the
    operator's cap, which stops every local job)."""
    bound = min(limit, cap) if limit else cap
    if estimate and estimate > 0:
        return min(estimate, bound)
    return bound


def expected_end(job: RunningJob, now: float, cap: float) -> float:
    """When a running job should free its devices: the trainer's ETA where it reports one, else its start
    plus its time estimate; a job already past its estimate (the estimate was wrong; loading is not in
    it) is expected to run as long again as it has so far. Never beyond its limit, never before now."""
    limit = min(job.limit_seconds, cap) if job.limit_seconds else cap
    if job.started_at is None:
        return now + duration(job.limit_seconds, job.estimate_seconds, cap)
    hard = job.started_at + limit
    if job.eta_seconds is not None and job.eta_seconds >= 0:
        return max(now, min(now + job.eta_seconds, hard))
    by_plan = job.started_at + duration(job.limit_seconds, job.estimate_seconds, cap)
    if by_plan < now:
        by_plan = min(hard, now + (now - job.started_at))
    return max(now, by_plan)


class _Pool:
    """One pool's devices over time: free now, and when each held device frees (expected ends)."""

    def __init__(self, free_now: int, ends: list[tuple[float, int]], now: float):
        self.now = now
        self.free = free_now
        self.ends = sorted(ends)  # (expected end, devices) of running and started jobs
        self.reserved: tuple[str, float, int] | None = None  # (job id, start, devices spare at start)

    def add_running(self, end: float, count: int) -> None:
        self.free -= count
        self.ends.append((end, count))
        self.ends.sort()

    def earliest(self, count: int) -> float:
        """The first time `count` devices are free, from the expected ends."""
        have = self.free
        if have >= count:
            return self.now
        for end, n in self.ends:
            have += n
            if have >= count:
                return end
        return math.inf

    def free_at(self, t: float) -> int:
        return self.free + sum(n for end, n in self.ends if end <= t)


def _rank(
    jobs: list[QueuedJob], held_by_owner: dict[str, int], usage: Usage, half_life: float
) -> list[QueuedJob]:
    """Priority first; then fair share among owners (lowest score next, each job raising its owner's
    score by its devices); then the oldest."""
    out: list[QueuedJob] = []
    by_priority: dict[int, dict[str, list[QueuedJob]]] = {}
    for j in jobs:
        by_priority.setdefault(PRIORITY_RANK.get(j.priority, 1), {}).setdefault(j.owner, []).append(j)
    score = {
        o: held_by_owner.get(o, 0) + usage.recent_device_seconds.get(o, 0.0) / half_life
        for o in {j.owner for j in jobs}
    }
    for level in sorted(by_priority, reverse=True):
        queues = by_priority[level]
        for q in queues.values():
            q.sort(key=lambda j: j.seq)
        heads = [(score[o], q[0].seq, o, 0) for o, q in queues.items()]
        heapq.heapify(heads)
        while heads:
            _, _, owner, i = heapq.heappop(heads)
            job = queues[owner][i]
            out.append(job)
            score[owner] += job.need.count
            if i + 1 < len(queues[owner]):
                heapq.heappush(heads, (score[owner], queues[owner][i + 1].seq, owner, i + 1))
    return out


def decide(
    queued: list[QueuedJob],
    running: list[RunningJob],
    settings: Settings,
    *,
    now: float,
    usage: Usage | None = None,
) -> Outcome:
    """`queued`: every queued job (any order); `running`: every job holding local devices. Returns the jobs
    to start (with the GPUs or slots each gets), the jobs to fail (can never start here, or past their
    owner's GPU hours), and for every other queued job its position, reason and estimated start."""
    usage = usage or Usage()
    cap = float(limits.max_seconds(settings))
    half_life = settings.fair_share_half_life_hours * 3600
    out = Outcome()

    free_gpus, free_slots = free_resources(settings, [r.resources for r in running])
    pools = {GPUS: _Pool(len(free_gpus), [], now), CPU_SLOTS: _Pool(free_slots, [], now)}
    held_by_owner: dict[tuple[str, str], int] = {}
    for r in running:
        if r.pool is None:
            continue
        pools[r.pool].ends.append((expected_end(r, now, cap), r.count))
        held_by_owner[(r.pool, r.owner)] = held_by_owner.get((r.pool, r.owner), 0) + r.count
    for p in pools.values():
        p.ends.sort()

    # The operator's settings, parsed once per owner and size rather than once per job.
    quotas: dict[tuple[str, str], int | None] = {}
    beyonds: dict[tuple[str, int], tuple[str, str] | None] = {}
    gpu_hours: dict[str, float | None] = {}

    def quota_of(pool: str, owner: str) -> int | None:
        if (pool, owner) not in quotas:
            quotas[(pool, owner)] = settings.quota_for(pool, owner)
        return quotas[(pool, owner)]

    by_pool: dict[str, list[QueuedJob]] = {GPUS: [], CPU_SLOTS: []}
    for job in sorted(queued, key=lambda j: j.seq):
        if job.need.pool is None:
            out.decisions.append(Decision(job.id, resources={}))
            continue
        size = (job.need.pool, job.need.count)
        if size not in beyonds:
            beyonds[size] = limits.beyond_local_pool(
                "cuda" if job.need.pool == GPUS else "cpu", job.need.count, settings
            )
        beyond = beyonds[size]
        if beyond is not None:
            out.decisions.append(Decision(job.id, impossible=beyond[1]))
            continue
        quota = quota_of(job.need.pool, job.owner)
        if quota is not None and job.need.count > quota:
            what = "GPUs" if job.need.pool == GPUS else "CPU slots"
            setting = "FTQ_QUOTA_GPUS" if job.need.pool == GPUS else "FTQ_QUOTA_CPU_SLOTS"
            out.decisions.append(
                Decision(
                    job.id,
                    impossible=f"the job needs {job.need.count} {what} but {job.owner}'s quota is {quota} "
                    f"at once ({setting}); ask for at most {quota}",
                    error_code=ErrorCode.quota_exceeded,
                )
            )
            continue
        if job.need.pool == GPUS:
            if job.owner not in gpu_hours:
                gpu_hours[job.owner] = settings.gpu_hours_quota_for(job.owner)
            hours = gpu_hours[job.owner]
            used = usage.period_gpu_seconds.get(job.owner, 0.0) / 3600
            if hours is not None and used >= hours:
                until = ""
                if usage.period_ends is not None:
                    until = f"; the period ends in {(usage.period_ends - now) / 3600:.1f} h"
                out.decisions.append(
                    Decision(
                        job.id,
                        impossible=f"{job.owner} has used {used:.1f} of their {hours:g} GPU hours of this "
                        f"period (FTQ_QUOTA_GPU_HOURS){until}; submit it again then, or ask the operator",
                        error_code=ErrorCode.quota_exceeded,
                    )
                )
                continue
        by_pool[job.need.pool].append(job)

    ranked_all: list[tuple[QueuedJob, str | None, float | None]] = []  # (job, reason or None: started)
    for pool_name, jobs in by_pool.items():
        if not jobs:
            continue
        pool = pools[pool_name]
        owners_held = {o: n for (p, o), n in held_by_owner.items() if p == pool_name}
        gpus_left = list(free_gpus)
        for job in _rank(jobs, owners_held, usage, half_life):
            n = job.need.count
            quota = quota_of(pool_name, job.owner)
            if quota is not None and owners_held.get(job.owner, 0) + n > quota:
                ranked_all.append((job, QUOTA, None))
                continue
            own_limit = min(job.limit_seconds, cap) if job.limit_seconds else cap
            if n <= pool.free:
                fits = True
                if pool.reserved is not None:
                    _, start, spare = pool.reserved
                    if now + own_limit <= start:
                        pass  # ends before the reserved start: cannot delay it
                    elif n <= spare:
                        pool.reserved = (pool.reserved[0], start, spare - n)
                    else:
                        fits = False
                if fits:
                    if pool_name == GPUS:
                        take, gpus_left = gpus_left[:n], gpus_left[n:]
                        resources: dict[str, Any] = {GPUS: take}
                    else:
                        resources = {CPU_SLOTS: n}
                    pool.add_running(now + duration(job.limit_seconds, job.estimate_seconds, cap), n)
                    owners_held[job.owner] = owners_held.get(job.owner, 0) + n
                    out.decisions.append(Decision(job.id, resources=resources))
                    ranked_all.append((job, None, now))
                    continue
                ranked_all.append((job, RESERVATION, None))
                continue
            if pool.reserved is None:
                start = pool.earliest(n)
                pool.reserved = (job.id, start, max(0, pool.free_at(start) - n))
                out.reservations[pool_name] = (job.id, start)
            ranked_all.append((job, NO_FREE_DEVICES, None))

    # Estimated starts: the waiting jobs in rank order on each pool's devices (list scheduling).
    starts = _simulate(ranked_all, pools_free={GPUS: len(free_gpus), CPU_SLOTS: free_slots},
                       running=running, now=now, cap=cap)  # fmt: skip
    position = 0
    for job, reason, _ in ranked_all:
        if reason is None:
            continue
        position += 1
        est = starts.get(job.id)
        if reason == QUOTA:
            est = None  # depends on when the owner's own jobs end, not on the queue
        out.waiting.append(Waiting(job.id, position, reason, None if est in (None, math.inf) else est))
    return out


def _simulate(
    ranked: list[tuple[QueuedJob, str | None, float | None]],
    *,
    pools_free: dict[str, int],
    running: list[RunningJob],
    now: float,
    cap: float,
) -> dict[str, float]:
    """When each waiting job should start: per pool, a heap of the time each device frees; a job takes
    the `count` earliest, starts when the last of them is free, and frees them after its duration."""
    free_times: dict[str, list[float]] = {p: [now] * n for p, n in pools_free.items()}
    for r in running:
        if r.pool is not None:
            free_times[r.pool].extend([expected_end(r, now, cap)] * r.count)
    for heap in free_times.values():
        heapq.heapify(heap)
    out: dict[str, float] = {}
    # What starts now takes the devices free now; then the waiting jobs in rank order.
    in_order = [x for x in ranked if x[1] is None] + [x for x in ranked if x[1] is not None]
    for job, reason, _ in in_order:
        pool = job.need.pool
        if pool is None or reason == QUOTA:
            continue
        heap = free_times[pool]
        if len(heap) < job.need.count:
            out[job.id] = math.inf
            continue
        taken = [heapq.heappop(heap) for _ in range(job.need.count)]
        start = max(taken) if reason is not None else now
        end = start + duration(job.limit_seconds, job.estimate_seconds, cap)
        for _ in taken:
            heapq.heappush(heap, end)
        out[job.id] = start
    return out
