"""Which queued jobs start, on which GPUs or CPU slots, and why the others wait (worker/scheduling.py):
priorities, fair share, backfill with a reservation, quotas, positions and estimated starts."""

from __future__ import annotations

from typing import Any

from ftq.contract.errors import ErrorCode
from ftq.runtime.settings import Settings
from worker import scheduling
from worker.scheduling import Running, RunRequest, Usage

NOW = 1_000_000.0


def spec(device: str = "cpu", procs: int = 1, launcher: str = "local", **extra: Any) -> dict[str, Any]:
    res = {"launcher": launcher, "device": device, "processes_per_node": procs, "num_nodes": 1}
    res.update(extra.pop("resources", {}))
    return {"resources": res, **extra}


def q(
    job_id: str,
    seq: int,
    *,
    owner: str = "alice",
    device: str = "cpu",
    procs: int = 1,
    priority: str = "normal",
    limit: float | None = None,
    launcher: str = "local",
) -> RunRequest:
    s = spec(device, procs, launcher, priority=priority, resources={"max_seconds": limit})
    return RunRequest.from_spec(job_id, owner, s, seq=seq)


def run(job_id: str, *, owner: str = "alice", slots: int = 0, gpus: list[int] | None = None,
        started: float = NOW - 10, limit: float | None = None) -> Running:  # fmt: skip
    resources: dict[str, Any] = {"gpus": gpus} if gpus else {"cpu_slots": slots}
    return Running(job_id, owner, resources, started_at=started, limit_seconds=limit)


def decide(queued: list[RunRequest], running: list[Running], settings: Settings, **kw: Any) -> Any:
    return scheduling.decide(queued, running, settings, now=NOW, **kw)


def test_gpus_are_disjoint_and_an_owners_jobs_go_oldest_first() -> None:
    s = Settings(gpu_pool="0,1,2,3", cpu_slots=2)
    running = [run("r1", gpus=[1]), run("r2", slots=1)]
    queued = [
        q("a", 1, device="cuda", procs=2),
        q("b", 2, device="cuda", procs=2),
        q("c", 3, device="cuda", procs=1),
        q("d", 4, procs=1),
        q("e", 5, procs=1),
        q("f", 6, device="cuda", procs=8, launcher="slurm"),
    ]
    out = decide(queued, running, s)
    assert out.started == {"a": {"gpus": [0, 2]}, "d": {"cpu_slots": 1}, "f": {}}
    waiting = {w.id: w for w in out.waiting}
    # b does not fit the one GPU left and holds the reservation; c would fit, but with no time limit of
    # its own it could run past b's reserved start: it waits for the reservation.
    assert waiting["b"].reason == scheduling.NO_FREE_DEVICES
    assert waiting["c"].reason == scheduling.RESERVATION
    assert waiting["e"].reason == scheduling.NO_FREE_DEVICES
    assert [w.id for w in out.waiting] == ["b", "c", "e"]
    assert [w.position for w in out.waiting] == [1, 2, 3]


def test_a_job_larger_than_the_pool_is_refused_with_the_reason() -> None:
    out = decide([q("big", 1, device="cuda", procs=8)], [], Settings(gpu_pool="0,1"))
    d = out.decisions[0]
    assert d.impossible and "needs 8 GPUs" in d.impossible and "FTQ_GPU_POOL" in d.impossible
    assert d.error_code == ErrorCode.launch_error
    out = decide([q("cpu", 1, procs=3)], [], Settings(cpu_slots=2))
    assert out.decisions[0].impossible and "FTQ_CPU_SLOTS" in out.decisions[0].impossible


def test_high_priority_goes_first_and_low_last() -> None:
    s = Settings(cpu_slots=1)
    queued = [q("low", 1, priority="low"), q("normal", 2), q("high", 3, priority="high")]
    out = decide(queued, [], s)
    assert list(out.started) == ["high"]
    assert [w.id for w in out.waiting] == ["normal", "low"]


def test_fair_share_the_owner_using_fewer_devices_goes_first() -> None:
    """Alice holds both slots and has three older jobs queued; bob's one job is next when a slot frees."""
    s = Settings(cpu_slots=2)
    queued = [q(f"alice-{i}", i, owner="alice") for i in range(3)] + [q("bob", 10, owner="bob")]
    running = [run("a-run1", slots=1), run("a-run2", slots=1)]
    out = decide(queued, running, s)
    assert out.started == {}
    assert [w.id for w in out.waiting] == ["bob", "alice-0", "alice-1", "alice-2"]
    # One of alice's runs ended: bob's job takes the slot.
    out = decide(queued, running[:1], s)
    assert out.started == {"bob": {"cpu_slots": 1}}


def test_owners_take_turns_and_recent_usage_counts() -> None:
    s = Settings(cpu_slots=4, fair_share_half_life_hours=1)
    queued = [
        q("a1", 1, owner="alice"),
        q("a2", 2, owner="alice"),
        q("b1", 3, owner="bob"),
        q("b2", 4, owner="bob"),
    ]
    out = decide(queued, [], Settings(cpu_slots=1))
    # Equal usage: the oldest first, then turns.
    assert list(out.started) == ["a1"]
    assert [w.id for w in out.waiting] == ["b1", "a2", "b2"]
    # Alice used 2 device-hours lately (about 2 devices over the last half-life): bob goes first twice.
    usage = Usage(recent_device_seconds={"alice": 2 * 3600.0})
    out = decide(queued, [], Settings(cpu_slots=1, fair_share_half_life_hours=1), usage=usage)
    assert list(out.started) == ["b1"]
    assert [w.id for w in out.waiting] == ["b2", "a1", "a2"]
    assert s.cpu_slots == 4


def test_backfill_only_when_it_ends_before_the_reserved_start() -> None:
    """Two slots; one runs until NOW+100 (its limit). A 2-slot job is reserved at NOW+100. A 1-slot job
    whose own limit ends before then starts in the gap; one that may run longer waits."""
    s = Settings(cpu_slots=2)
    running = [run("r", slots=1, started=NOW - 20, limit=120)]
    queued = [
        q("two", 1, procs=2, limit=60),
        q("long", 2, limit=500),
        q("short", 3, limit=50),
        q("open", 4),  # no limit of its own: the operator's cap
    ]
    out = decide(queued, running, s)
    assert out.started == {"short": {"cpu_slots": 1}}
    assert out.reservations == {"cpu_slots": ("two", NOW + 100)}
    waiting = {w.id: w for w in out.waiting}
    assert waiting["two"].reason == scheduling.NO_FREE_DEVICES
    assert waiting["two"].estimated_start == NOW + 100
    assert waiting["long"].reason == scheduling.RESERVATION
    assert waiting["open"].reason == scheduling.NO_FREE_DEVICES  # short took the free slot
    # After the reserved job: long starts when `two` ends (its limit: 60 s), and `open` beside it.
    assert waiting["long"].estimated_start == NOW + 160
    assert waiting["open"].estimated_start == NOW + 160
    # A 1-slot job exactly as long as the gap still fits; a second one does not (one slot free).
    out = decide([q("two", 1, procs=2), q("open", 2), q("gap", 3, limit=100)], running, s)
    assert out.started == {"gap": {"cpu_slots": 1}}
    assert {w.id: w.reason for w in out.waiting} == {"two": "no_free_devices", "open": "reservation"}


def test_backfill_may_use_devices_the_reserved_job_does_not_need() -> None:
    """Four GPUs, two held until NOW+100. A 3-GPU job is reserved then, when 4 are free: one GPU is
    spare at its start, so one long 1-GPU job may run past it; a second may not."""
    s = Settings(gpu_pool="0,1,2,3")
    running = [run("r", gpus=[0, 1], limit=110)]
    queued = [
        q("three", 1, device="cuda", procs=3),
        q("long1", 2, device="cuda", procs=1),
        q("long2", 3, device="cuda", procs=1),
    ]
    out = decide(queued, running, s)
    assert out.started == {"long1": {"gpus": [2]}}
    waiting = {w.id: w for w in out.waiting}
    assert waiting["long2"].reason == scheduling.RESERVATION
    assert waiting["three"].estimated_start == NOW + 100


def test_concurrent_quota_makes_a_job_wait_and_a_job_past_it_alone_fails() -> None:
    s = Settings(cpu_slots=4, quota_cpu_slots="alice:2,*:4")
    running = [run("r", owner="alice", slots=2)]
    out = decide([q("a", 1, owner="alice"), q("b", 2, owner="bob", procs=2)], running, s)
    assert out.started == {"b": {"cpu_slots": 2}}
    assert [(w.id, w.reason, w.estimated_start) for w in out.waiting] == [("a", scheduling.QUOTA, None)]
    out = decide([q("big", 1, owner="alice", procs=3)], [], s)
    d = out.decisions[0]
    assert d.error_code == ErrorCode.quota_exceeded and d.impossible and "FTQ_QUOTA_CPU_SLOTS" in d.impossible


def test_gpu_hours_of_the_period_used_up_fail_the_job_with_quota_exceeded() -> None:
    s = Settings(gpu_pool="0,1", quota_gpu_hours="alice:10")
    usage = Usage(period_gpu_seconds={"alice": 10 * 3600.0, "bob": 50 * 3600.0}, period_ends=NOW + 7200)
    queued = [q("a", 1, owner="alice", device="cuda"), q("b", 2, owner="bob", device="cuda")]
    out = decide(queued, [], s, usage=usage)
    failed = [d for d in out.decisions if d.impossible]
    assert [d.id for d in failed] == ["a"]
    assert failed[0].error_code == ErrorCode.quota_exceeded
    assert "FTQ_QUOTA_GPU_HOURS" in (failed[0].impossible or "") and "2.0 h" in (failed[0].impossible or "")
    assert out.started == {"b": {"gpus": [0]}}  # bob has no quota


def test_estimated_starts_follow_the_running_jobs_ends_and_estimates() -> None:
    s = Settings(cpu_slots=1)
    running = [Running("r", "alice", {"cpu_slots": 1}, started_at=NOW - 50, estimate_seconds=80)]
    queued = [
        RunRequest.from_spec("x", "bob", spec(), seq=1, estimate=40),
        RunRequest.from_spec("y", "bob", spec(), seq=2, estimate=40),
    ]
    out = decide(queued, running, s)
    assert [(w.id, w.position, w.estimated_start) for w in out.waiting] == [
        ("x", 1, NOW + 30),
        ("y", 2, NOW + 70),
    ]
    # The trainer's ETA replaces the plan's estimate for a running job.
    running = [
        Running("r", "alice", {"cpu_slots": 1}, started_at=NOW - 50, estimate_seconds=80, eta_seconds=5)
    ]
    out = decide(queued, running, s)
    assert out.waiting[0].estimated_start == NOW + 5


def test_a_running_job_past_its_estimate_is_expected_to_run_as_long_again() -> None:
    """The estimate was wrong once a run outlives it: it is expected to run as long again as it has so
    far, within its limit."""
    late = Running(
        "r", "alice", {"cpu_slots": 1}, started_at=NOW - 100, limit_seconds=300, estimate_seconds=80
    )
    assert scheduling.expected_end(late, NOW, cap=3600) == NOW + 100
    later = Running(
        "r", "alice", {"cpu_slots": 1}, started_at=NOW - 250, limit_seconds=300, estimate_seconds=80
    )
    assert scheduling.expected_end(later, NOW, cap=3600) == NOW + 50  # its limit
    on_time = Running(
        "r", "alice", {"cpu_slots": 1}, started_at=NOW - 50, limit_seconds=300, estimate_seconds=80
    )
    assert scheduling.expected_end(on_time, NOW, cap=3600) == NOW + 30
    no_limit = Running("r", "alice", {"cpu_slots": 1}, started_at=NOW - 100, estimate_seconds=80)
    assert scheduling.expected_end(no_limit, NOW, cap=3600) == NOW + 100


# Exports: the same scheduler, one process of their job's launcher and device ---------------------------


def export(export_id: str, submitted: float, *, owner: str = "alice", device: str = "cpu") -> RunRequest:
    """A queued export as `worker.exports` asks for one: one device, no time limit of its own."""
    need = scheduling.Need(scheduling.GPUS if device == "cuda" else scheduling.CPU_SLOTS, 1)
    return RunRequest(
        export_id, owner, need, estimate_seconds=600, kind=scheduling.EXPORT, submitted=submitted, seq=1
    )


def test_an_export_does_not_take_the_devices_reserved_for_the_job_at_the_head_of_the_queue() -> None:
    """Two slots, one held until NOW+100: the 2-slot job at the head reserves both then. An export fits
    the free slot, but with no time limit it could hold it past the reserved start: it waits."""
    s = Settings(cpu_slots=2)
    running = [run("r", owner="carol", slots=1, started=NOW - 20, limit=120)]
    job = RunRequest.from_spec("two", "alice", spec(procs=2), seq=1, submitted=NOW - 60)
    out = decide([job, export("exp", NOW - 30, owner="bob")], running, s)
    assert out.started == {}
    assert out.reservations == {"cpu_slots": ("two", NOW + 100)}
    waiting = {w.id: w for w in out.waiting}
    assert (waiting["exp"].kind, waiting["exp"].reason) == (scheduling.EXPORT, scheduling.RESERVATION)
    assert [w.position for w in out.waiting] == [1, 2]
    # A device spare at the reserved start (4 GPUs, the job needs 3): the export may take it.
    s = Settings(gpu_pool="0,1,2,3")
    running = [run("r", gpus=[0, 1], limit=110)]
    job = RunRequest.from_spec("three", "alice", spec("cuda", 3), seq=1, submitted=NOW - 60)
    out = decide([job, export("exp", NOW - 30, device="cuda")], running, s)
    assert out.started == {"exp": {"gpus": [2]}}
    assert [d.kind for d in out.decisions] == [scheduling.EXPORT]


def test_an_export_past_its_owners_quota_waits_with_the_reason() -> None:
    """Alice's quota is one slot and her job holds it: her export waits (quota), bob's starts."""
    s = Settings(cpu_slots=4, quota_cpu_slots="alice:1")
    running = [run("r", owner="alice", slots=1)]
    out = decide([export("exp_a", NOW - 50), export("exp_b", NOW - 40, owner="bob")], running, s)
    assert out.started == {"exp_b": {"cpu_slots": 1}}
    assert [(w.id, w.kind, w.reason, w.estimated_start) for w in out.waiting] == [
        ("exp_a", scheduling.EXPORT, scheduling.QUOTA, None)
    ]
    # An export that holds the slot counts in the quota as a job does: alice's next job waits.
    running = [Running("exp_running", "alice", {"cpu_slots": 1}, started_at=NOW - 5)]
    out = decide([q("j", 1, owner="alice")], running, s)
    assert [(w.id, w.reason) for w in out.waiting] == [("j", scheduling.QUOTA)]


def test_fair_share_orders_exports_and_jobs_together() -> None:
    """One slot free. Alice holds one (her running export); her older export and job wait behind bob's
    newer job; among alice's own, the oldest request first, whatever its kind."""
    s = Settings(cpu_slots=2)
    running = [Running("exp_running", "alice", {"cpu_slots": 1}, started_at=NOW - 5)]
    queued = [
        RunRequest.from_spec("a_job", "alice", spec(), seq=7, submitted=NOW - 20),
        export("a_exp", NOW - 30),
        RunRequest.from_spec("b_job", "bob", spec(), seq=9, submitted=NOW - 10),
    ]
    out = decide(queued, running, s)
    assert out.started == {"b_job": {"cpu_slots": 1}}
    assert [(w.id, w.kind, w.position) for w in out.waiting] == [
        ("a_exp", scheduling.EXPORT, 1),
        ("a_job", scheduling.JOB, 2),
    ]
    # Bob's usage of late outweighs alice's running export: her oldest request, the export, goes first.
    usage = Usage(recent_device_seconds={"bob": 4 * 3600.0})
    out = decide(queued, running, Settings(cpu_slots=2, fair_share_half_life_hours=1), usage=usage)
    assert out.started == {"a_exp": {"cpu_slots": 1}}
