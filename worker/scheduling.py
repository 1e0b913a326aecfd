"""Which queued runs start now, and for every other one its place, why it waits and when it should start
(pure functions, no I/O: `decide` takes rows and numbers, and returns decisions).

A run is anything that holds devices of the worker's pools: a job's training run, an export (one process
of its job's launcher and device), and each later kind alike. Each queued one comes in as a
`RunRequest` (its kind, owner, devices, priority, when it was submitted, how long it should take), each
one holding devices as a `Running`; one ranking, one set of quotas and one reservation cover them all.

Pools. Local CUDA runs take their processes' GPUs out of FTQ_GPU_POOL, disjoint from every other run's;
local CPU runs take their processes' slots of FTQ_CPU_SLOTS. SLURM runs take nothing here: SLURM queues
them itself (priority becomes --nice / QOS in job.sbatch), so they start at once.

Order within a pool (the rank):
1. `priority`: high, then normal, then low.
2. Fair share among equal priorities: the owner whose score is lowest goes first. The score is the
   devices of this pool the owner holds now plus their recent usage (device-seconds of finished runs,
   halved every FTQ_FAIR_SHARE_HALF_LIFE_HOURS) divided by the half-life, i.e. devices now plus about the
   devices they held on average lately. Each run ranked adds its devices to its owner's score, so owners
   take turns rather than one owner's whole backlog going first.
3. The oldest request (submitted first).

Backfill with one reservation per pool (EASY backfilling). Runs start in rank order while they fit. The
first one that does not fit gets a reservation: the earliest time at which enough devices are free, from
the running runs' expected ends (`expected_end`). A later-ranked run that fits the free devices still
starts if it cannot delay that reservation: it ends by its own time limit (`resources.max_seconds`) before
the reserved start, or it uses only devices that are free even after the reserved run has taken its
share. Otherwise it waits with the reason `reservation`. A run with no limit of its own (an export) may
only take such spare devices. A reservation rests on the running runs' expected ends (`expected_end`: the
trainer's ETA, else the plan's time estimate, and for a run past its estimate as long again as it has
run; never past its limit), so it holds exactly where those are limits, and is a best estimate otherwise.

Quotas (operator settings). A run that would take its owner past their concurrent quota of a pool
(FTQ_QUOTA_GPUS, FTQ_QUOTA_CPU_SLOTS) waits with the reason `quota` (it is not counted against anyone's
reservation); one that asks for more than the quota alone can never start and fails with quota_exceeded.
An owner who has used their GPU hours of the current period (FTQ_QUOTA_GPU_HOURS) has their queued cuda
runs fail with quota_exceeded: waiting would hold the queue for up to a whole period, and the message says
when the period ends.

Estimated starts simulate the queue in rank order on each pool's devices (list scheduling: a run starts
when its devices are free, and holds them for its expected duration).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ftq.contract.errors import ErrorCode
from ftq.runtime import limits
from ftq.runtime.settings import Settings

GPUS = "gpus"
CPU_SLOTS = "cpu_slots"

# The kinds of run that go through the scheduler (a RunRequest's `kind`); each is a `worker.lifecycle.Kind`.
JOB = "job"
EXPORT = "export"
EVALUATION = "evaluation"
DEPLOYMENT = "deployment"
TRAINING_CLIENT = "training_client"

# Why a queued run waits (its `queue.reason`).
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


def pool_of(launcher: str, device: str) -> str | None:
    """The local pool a run of this launcher and device draws on (None: SLURM's, not ours)."""
    if launcher != "local":
        return None
    return GPUS if device == "cuda" else CPU_SLOTS


@dataclass(frozen=True)
class RunRequest:
    """A queued run of any kind, as the scheduler weighs it."""

    id: str
    owner: str
    need: Need
    priority: str = "normal"
    seq: int = 0  # its table's insertion order: the tie-break among requests submitted together
    limit_seconds: float | None = None  # its own time limit (resources.max_seconds), if it set one
    estimate_seconds: float | None = None  # how long it should take (a job's plan estimate), if known
    kind: str = JOB
    submitted: float = 0.0  # unix time it was submitted: the oldest goes first, whatever its kind

    @property
    def age_order(self) -> tuple[float, int]:
        return (self.submitted, self.seq)

    @classmethod
    def from_spec(
        cls,
        job_id: str,
        owner: str,
        spec: dict[str, Any],
        *,
        seq: int = 0,
        estimate: float | None = None,
        submitted: float = 0.0,
    ) -> RunRequest:
        """A queued job's request, from its spec."""
        res = spec.get("resources") or {}
        return cls(
            id=job_id,
            owner=owner,
            need=need_of(spec),
            priority=str(spec.get("priority") or "normal"),
            seq=seq,
            limit_seconds=res.get("max_seconds"),
            estimate_seconds=estimate,
            submitted=submitted,
        )


@dataclass(frozen=True)
class Running:
    """A run holding devices now (starting, running or cancelling), of any kind."""

    id: str
    owner: str
    resources: dict[str, Any]  # {"gpus": [0, 1]} or {"cpu_slots": 2}
    started_at: float | None = None  # unix time; None: claimed, not launched yet
    limit_seconds: float | None = None
    estimate_seconds: float | None = None
    eta_seconds: float | None = None  # what the trainer's progress says is left

    @classmethod
    def of(cls, row: Any, **more: Any) -> Running:
        """From a stored row's id, owner, resources and started_at (a datetime), and what else is known."""
        started = row.started_at.timestamp() if row.started_at else None
        return cls(row.id, row.owner, row.resources, started, **more)

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
    id: str
    kind: str = JOB
    resources: dict[str, Any] | None = None  # start with these
    impossible: str | None = None  # can never start here (or not in this quota period): the reason
    error_code: str = ErrorCode.launch_error  # the code the run fails with when impossible


@dataclass(frozen=True)
class Waiting:
    id: str
    kind: str
    position: int  # 1 = next; over every waiting local run, in rank order
    reason: str  # no_free_devices | reservation | quota
    estimated_start: float | None  # unix time; None when it cannot be told


@dataclass
class Outcome:
    decisions: list[Decision] = field(default_factory=list)  # to start, or to fail
    waiting: list[Waiting] = field(default_factory=list)
    reservations: dict[str, tuple[str, float]] = field(default_factory=dict)  # pool -> (run id, start)

    @property
    def started(self) -> dict[str, dict[str, Any]]:
        return {d.id: d.resources for d in self.decisions if d.resources is not None}


def free_resources(settings: Settings, held: list[dict[str, Any]]) -> tuple[list[int], int]:
    used_gpus = {int(g) for r in held for g in (r.get(GPUS) or [])}
    used_slots = sum(int(r.get(CPU_SLOTS) or 0) for r in held)
    gpus = [g for g in settings.gpu_indices if g not in used_gpus]
    return gpus, max(0, settings.cpu_slots - used_slots)


def duration(limit: float | None, estimate: float | None, cap: float) -> float:
    """How long a run is expected to hold its devices: its estimate, never beyond its own limit (or the
    operator's cap, which stops every local job)."""
    bound = min(limit, cap) if limit else cap
    if estimate and estimate > 0:
        return min(estimate, bound)
    return bound


def expected_end(run: Running, now: float, cap: float) -> float:
    """When a running run should free its devices: the trainer's ETA where it reports one, else its start
    plus its time estimate; one already past its estimate (the estimate was wrong; loading is not in
    it) is expected to run as long again as it has so far. Never beyond its limit, never before now."""
    limit = min(run.limit_seconds, cap) if run.limit_seconds else cap
    if run.started_at is None:
        return now + duration(run.limit_seconds, run.estimate_seconds, cap)
    hard = run.started_at + limit
    if run.eta_seconds is not None and run.eta_seconds >= 0:
        return max(now, min(now + run.eta_seconds, hard))
    by_plan = run.started_at + duration(run.limit_seconds, run.estimate_seconds, cap)
    if by_plan < now:
        by_plan = min(hard, now + (now - run.started_at))
    return max(now, by_plan)


class _Rules:
    """The operator's settings as one tick reads them, each parsed once per owner or size rather than once
    per request, and the figures every step of a tick shares."""

    def __init__(self, settings: Settings, usage: Usage, now: float):
        self.settings = settings
        self.usage = usage
        self.now = now
        self.cap = float(limits.max_seconds(settings))
        self.half_life = settings.fair_share_half_life_hours * 3600
        self._quotas: dict[tuple[str, str], int | None] = {}
        self._beyond: dict[tuple[str, int], tuple[str, str] | None] = {}
        self._gpu_hours: dict[str, float | None] = {}

    def quota(self, pool: str, owner: str) -> int | None:
        if (pool, owner) not in self._quotas:
            self._quotas[(pool, owner)] = self.settings.quota_for(pool, owner)
        return self._quotas[(pool, owner)]

    def beyond_pool(self, need: Need) -> tuple[str, str] | None:
        size = (need.pool or "", need.count)
        if size not in self._beyond:
            device = "cuda" if need.pool == GPUS else "cpu"
            self._beyond[size] = limits.beyond_local_pool(device, need.count, self.settings)
        return self._beyond[size]

    def gpu_hours(self, owner: str) -> float | None:
        if owner not in self._gpu_hours:
            self._gpu_hours[owner] = self.settings.gpu_hours_quota_for(owner)
        return self._gpu_hours[owner]

    def own_limit(self, req: RunRequest) -> float:
        return min(req.limit_seconds, self.cap) if req.limit_seconds else self.cap

    def duration(self, req: RunRequest) -> float:
        return duration(req.limit_seconds, req.estimate_seconds, self.cap)


class _Pool:
    """One pool's devices over time: free now, and when each held device frees (expected ends); the GPU
    indices still free to hand out; its one reservation."""

    def __init__(self, name: str, free_now: int, ends: list[tuple[float, int]], now: float, gpus: list[int]):
        self.name = name
        self.now = now
        self.free = free_now
        self.ends = sorted(ends)  # (expected end, devices) of running and started runs
        self.gpus = list(gpus)  # for GPUS: the free indices, lowest first
        self.reserved: tuple[str, float, int] | None = None  # (run id, start, devices spare at start)

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

    def reserve(self, req: RunRequest) -> float | None:
        """The first request that does not fit holds the pool's reservation: its start; None when another
        holds it already."""
        if self.reserved is not None:
            return None
        start = self.earliest(req.need.count)
        self.reserved = (req.id, start, max(0, self.free_at(start) - req.need.count))
        return start

    def spares_reservation(self, count: int, ends_by: float) -> bool:
        """Whether `count` devices taken now until `ends_by` leave the reservation's start intact: no
        reservation, it ends before the reserved start, or it takes devices spare at that start (which it
        then uses up)."""
        if self.reserved is None:
            return True
        run_id, start, spare = self.reserved
        if ends_by <= start:
            return True
        if count <= spare:
            self.reserved = (run_id, start, spare - count)
            return True
        return False

    def take(self, count: int, until: float) -> dict[str, Any]:
        """Hand out `count` devices until `until`: the resources the run starts with."""
        self.free -= count
        self.ends.append((until, count))
        self.ends.sort()
        if self.name == GPUS:
            take, self.gpus = self.gpus[:count], self.gpus[count:]
            return {GPUS: take}
        return {CPU_SLOTS: count}


class _Placed(NamedTuple):
    request: RunRequest
    reason: str | None  # why it waits; None: it starts now


def decide(
    queued: list[RunRequest],
    running: list[Running],
    settings: Settings,
    *,
    now: float,
    usage: Usage | None = None,
) -> Outcome:
    """`queued`: every queued run of every kind (any order); `running`: every run holding local devices.
    Returns the runs to start (with the GPUs or slots each gets), the runs to fail (can never start here,
    or past their owner's GPU hours), and for every other queued run its position, reason and estimated
    start."""
    rules = _Rules(settings, usage or Usage(), now)
    out = Outcome()
    pools, held = _pools(running, rules)
    free_now = {name: p.free for name, p in pools.items()}
    by_pool = _admit(queued, rules, out)
    placed: list[_Placed] = []
    for name, requests in by_pool.items():
        if requests:
            placed += _place(pools[name], requests, held[name], rules, out)
    starts = _simulate(placed, pools_free=free_now, running=running, rules=rules)
    out.waiting = _waiting(placed, starts)
    return out


def _pools(running: list[Running], rules: _Rules) -> tuple[dict[str, _Pool], dict[str, dict[str, int]]]:
    """Each pool as the running runs leave it, and the devices each owner holds of it."""
    free_gpus, free_slots = free_resources(rules.settings, [r.resources for r in running])
    pools = {
        GPUS: _Pool(GPUS, len(free_gpus), [], rules.now, free_gpus),
        CPU_SLOTS: _Pool(CPU_SLOTS, free_slots, [], rules.now, []),
    }
    held: dict[str, dict[str, int]] = {GPUS: {}, CPU_SLOTS: {}}
    for r in running:
        if r.pool is None:
            continue
        pools[r.pool].ends.append((expected_end(r, rules.now, rules.cap), r.count))
        held[r.pool][r.owner] = held[r.pool].get(r.owner, 0) + r.count
    for p in pools.values():
        p.ends.sort()
    return pools, held


def _admit(queued: list[RunRequest], rules: _Rules, out: Outcome) -> dict[str, list[RunRequest]]:
    """Start at once what holds nothing here (SLURM's), fail what can never start (or not in this quota
    period); the rest, by pool, for the ranking."""
    by_pool: dict[str, list[RunRequest]] = {GPUS: [], CPU_SLOTS: []}
    for req in sorted(queued, key=lambda r: r.age_order):
        if req.need.pool is None:
            out.decisions.append(Decision(req.id, req.kind, resources={}))
            continue
        refused = _refusal(req, rules)
        if refused is not None:
            out.decisions.append(refused)
            continue
        by_pool[req.need.pool].append(req)
    return by_pool


def _refusal(req: RunRequest, rules: _Rules) -> Decision | None:
    """Why `req` can never start here, or not in this quota period, as the decision that fails it."""
    pool, n = req.need.pool or "", req.need.count
    beyond = rules.beyond_pool(req.need)
    if beyond is not None:
        return Decision(req.id, req.kind, impossible=beyond[1])
    quota = rules.quota(pool, req.owner)
    if quota is not None and n > quota:
        what, setting = ("GPUs", "FTQ_QUOTA_GPUS") if pool == GPUS else ("CPU slots", "FTQ_QUOTA_CPU_SLOTS")
        why = (
            f"the {req.kind} needs {n} {what} but {req.owner}'s quota is {quota} at once ({setting}); "
            f"ask for at most {quota}"
        )
        return Decision(req.id, req.kind, impossible=why, error_code=ErrorCode.quota_exceeded)
    if pool == GPUS:
        return _past_gpu_hours(req, rules)
    return None


def _past_gpu_hours(req: RunRequest, rules: _Rules) -> Decision | None:
    hours = rules.gpu_hours(req.owner)
    used = rules.usage.period_gpu_seconds.get(req.owner, 0.0) / 3600
    if hours is None or used < hours:
        return None
    until = ""
    if rules.usage.period_ends is not None:
        until = f"; the period ends in {(rules.usage.period_ends - rules.now) / 3600:.1f} h"
    why = (
        f"{req.owner} has used {used:.1f} of their {hours:g} GPU hours of this period (FTQ_QUOTA_GPU_HOURS)"
        f"{until}; submit it again then, or ask the operator"
    )
    return Decision(req.id, req.kind, impossible=why, error_code=ErrorCode.quota_exceeded)


def _rank(
    requests: list[RunRequest], held_by_owner: dict[str, int], usage: Usage, half_life: float
) -> list[RunRequest]:
    """Priority first; then fair share among owners (lowest score next, each request raising its owner's
    score by its devices); then the oldest."""
    out: list[RunRequest] = []
    by_priority: dict[int, dict[str, list[RunRequest]]] = {}
    for r in requests:
        by_priority.setdefault(PRIORITY_RANK.get(r.priority, 1), {}).setdefault(r.owner, []).append(r)
    score = {
        o: held_by_owner.get(o, 0) + usage.recent_device_seconds.get(o, 0.0) / half_life
        for o in {r.owner for r in requests}
    }
    for level in sorted(by_priority, reverse=True):
        queues = by_priority[level]
        for q in queues.values():
            q.sort(key=lambda r: r.age_order)
        heads = [(score[o], q[0].age_order, o, 0) for o, q in queues.items()]
        heapq.heapify(heads)
        while heads:
            _, _, owner, i = heapq.heappop(heads)
            req = queues[owner][i]
            out.append(req)
            score[owner] += req.need.count
            if i + 1 < len(queues[owner]):
                heapq.heappush(heads, (score[owner], queues[owner][i + 1].age_order, owner, i + 1))
    return out


def _place(
    pool: _Pool, requests: list[RunRequest], held: dict[str, int], rules: _Rules, out: Outcome
) -> list[_Placed]:
    """One pool's requests in rank order: each starts (its devices taken now), or waits with its reason;
    the first that does not fit reserves the pool."""
    placed: list[_Placed] = []
    for req in _rank(requests, held, rules.usage, rules.half_life):
        reason = _wait_reason(req, pool, held, rules)
        if reason is None:
            resources = pool.take(req.need.count, rules.now + rules.duration(req))
            held[req.owner] = held.get(req.owner, 0) + req.need.count
            out.decisions.append(Decision(req.id, req.kind, resources=resources))
        elif reason == NO_FREE_DEVICES and (start := pool.reserve(req)) is not None:
            out.reservations[pool.name] = (req.id, start)
        placed.append(_Placed(req, reason))
    return placed


def _wait_reason(req: RunRequest, pool: _Pool, held: dict[str, int], rules: _Rules) -> str | None:
    """Why `req` cannot start now (None: it can, and has taken any spare devices of the reservation)."""
    n = req.need.count
    quota = rules.quota(pool.name, req.owner)
    if quota is not None and held.get(req.owner, 0) + n > quota:
        return QUOTA
    if n > pool.free:
        return NO_FREE_DEVICES
    if not pool.spares_reservation(n, rules.now + rules.own_limit(req)):
        return RESERVATION
    return None


def _waiting(placed: list[_Placed], starts: dict[str, float]) -> list[Waiting]:
    """Every waiting run's position (over all pools, in rank order), reason and estimated start."""
    out: list[Waiting] = []
    for req, reason in placed:
        if reason is None:
            continue
        # A run over its owner's quota starts when the owner's own runs end, not when the queue moves.
        est = None if reason == QUOTA else starts.get(req.id)
        out.append(Waiting(req.id, req.kind, len(out) + 1, reason, None if est in (None, math.inf) else est))
    return out


def _simulate(
    placed: list[_Placed], *, pools_free: dict[str, int], running: list[Running], rules: _Rules
) -> dict[str, float]:
    """When each waiting run should start: per pool, a heap of the time each device frees; a run takes
    the `count` earliest, starts when the last of them is free, and frees them after its duration."""
    free_times: dict[str, list[float]] = {p: [rules.now] * n for p, n in pools_free.items()}
    for r in running:
        if r.pool is not None:
            free_times[r.pool].extend([expected_end(r, rules.now, rules.cap)] * r.count)
    for heap in free_times.values():
        heapq.heapify(heap)
    out: dict[str, float] = {}
    # What starts now takes the devices free now; then the waiting runs in rank order.
    in_order = [x for x in placed if x.reason is None] + [x for x in placed if x.reason is not None]
    for req, reason in in_order:
        pool = req.need.pool
        if pool is None or reason == QUOTA:
            continue
        heap = free_times[pool]
        if len(heap) < req.need.count:
            out[req.id] = math.inf
            continue
        taken = [heapq.heappop(heap) for _ in range(req.need.count)]
        start = max(taken) if reason is not None else rules.now
        end = start + rules.duration(req)
        for _ in taken:
            heapq.heappush(heap, end)
        out[req.id] = start
    return out
