"""A shared box, shared fairly, on a real `ftq up` with two owners and 2 CPU slots (real launches of the
tiny model): fair share, priority, backfill with a reservation, usage accounting, time estimates.

alice fills the box with long jobs (they train until cancelled); the test ends her runs by cancelling
them, so "a running job ends" happens when the test says. While they hold their slots they run at nice 19,
so that the runs the test waits for are not slowed by them on a two-core machine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.harness import QUICK_SETTINGS, TINY, Deployment, example_spec, run_ftq, tiny_assets, tiny_spec

ALICE = "alice-sched-token-0001"
BOB = "bob-sched-token-0002"
ACTIVE = ("starting", "running", "cancelling")
STARTED = ("starting", "running", "cancelling", "succeeded", "failed")
LONG_STEPS = 1_000_000  # trains until cancelled (or its max_seconds)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tiny_assets()
    settings = {**QUICK_SETTINGS, "cpu_slots": 2, "max_priority": "bob:normal", "post_rate_per_minute": 10000}
    dep = Deployment(
        tmp_path_factory.mktemp("sched") / "box", tokens={"alice": ALICE, "bob": BOB}, settings=settings
    )
    dep.start()
    yield dep
    dep.close(cancel_active=True)


def _client(box: Deployment, token: str) -> httpx.Client:
    return httpx.Client(base_url=box.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _spec(name: str, *, long: bool = False, processes: int = 1, **extra: Any) -> dict[str, Any]:
    spec = tiny_spec(TINY, name=name, max_steps=LONG_STEPS if long else 3, processes=processes)
    resources = extra.pop("resources", {})
    spec["resources"].update(resources)
    spec.update(extra)
    return spec


def _post(c: httpx.Client, spec: dict[str, Any]) -> str:
    r = c.post("/jobs", json=spec)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _job(c: httpx.Client, job_id: str) -> dict[str, Any]:
    r = c.get(f"/jobs/{job_id}")
    assert r.status_code == 200, r.text
    job: dict[str, Any] = r.json()
    return job


def _wait(
    box: Deployment, c: httpx.Client, job_id: str, pred: Any, what: str, timeout: float = 240
) -> dict[str, Any]:
    import time

    deadline = time.monotonic() + timeout
    job = _job(c, job_id)
    while time.monotonic() < deadline:
        job = _job(c, job_id)
        if pred(job):
            return job
        time.sleep(0.3)
    raise AssertionError(f"{what} not reached for {job_id}: {job}\n{box.report(job_id)}")


def _running(box: Deployment, c: httpx.Client, job_id: str) -> dict[str, Any]:
    return _wait(box, c, job_id, lambda j: j["status"] == "running", "running")


def _ended(box: Deployment, c: httpx.Client, job_id: str) -> dict[str, Any]:
    return _wait(box, c, job_id, lambda j: j["status"] in ("succeeded", "failed", "cancelled"), "ended")


def _cancel(box: Deployment, c: httpx.Client, job_id: str) -> dict[str, Any]:
    assert c.post(f"/jobs/{job_id}/cancel").status_code == 202
    return _ended(box, c, job_id)


def _when(job: dict[str, Any], field: str) -> datetime:
    return datetime.fromisoformat(job[field])


def test_fair_share_priority_backfill_and_usage(box: Deployment) -> None:
    alice, bob = _client(box, ALICE), _client(box, BOB)
    jobs: dict[str, httpx.Client] = {}

    # 1. alice fills both slots and queues a third long job; bob queues a short one, alice a high one.
    a = [_post(alice, _spec(f"alice-long-{i}", long=True)) for i in range(3)]
    jobs.update(dict.fromkeys(a, alice))
    for long_id in a[:2]:
        _running(box, alice, long_id)
        box.deprioritize(long_id)
    b1 = _post(bob, _spec("bob-short"))
    high = _post(alice, _spec("alice-high", priority="high"))
    jobs.update({b1: bob, high: alice})
    r = bob.post("/jobs", json=_spec("bob-high", priority="high"))  # the operator keeps bob at normal
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "priority", r.text

    # Ranked: the high job; then bob (no devices held) ahead of alice's older queued job.
    _wait(box, alice, a[2], lambda j: (j["queue"] or {}).get("position") == 3, "third in the queue")
    assert _job(alice, high)["queue"]["position"] == 1
    assert _job(bob, b1)["queue"]["position"] == 2
    assert _job(bob, b1)["queue"]["reason"] == "no_free_devices"

    # 2. One of alice's runs ends: the high job starts, and nothing else.
    _cancel(box, alice, a[0])
    _wait(box, alice, high, lambda j: j["status"] in STARTED, "the high job started")
    assert _job(bob, b1)["status"] == "queued" and _job(alice, a[2])["status"] == "queued"
    # 3. Another ends: bob's job starts, ahead of alice's older queued one.
    _cancel(box, alice, a[1])
    started = _wait(box, bob, b1, lambda j: j["status"] in STARTED, "bob's job started")
    assert started["queue"] is None
    assert _job(alice, a[2])["status"] == "queued", "alice's older queued job went ahead of bob's"
    _cancel(box, alice, a[2])
    assert _ended(box, alice, high)["status"] == "succeeded", box.report(high)
    assert _ended(box, bob, b1)["status"] == "succeeded", box.report(b1)

    # 4. Backfill: alice runs a long job limited to 300 s; bob's 2-slot job is reserved its end. A 1-slot
    # job whose max_seconds ends before that starts in the gap; one that may run past it waits.
    held = _running(box, alice, _post(alice, _spec("alice-held", long=True, resources={"max_seconds": 300})))
    box.deprioritize(held["id"])
    jobs[held["id"]] = alice
    two = _post(bob, _spec("bob-two-slots", processes=2))
    jobs[two] = bob
    reserved = _wait(box, bob, two, lambda j: j["queue"] is not None, "a reservation")["queue"]
    assert reserved["reason"] == "no_free_devices"
    expected = _when(held, "started_at").timestamp() + 300
    start = datetime.fromisoformat(reserved["estimated_start"]).timestamp()
    assert abs(start - expected) < 15, (reserved, held["started_at"])
    too_long = _post(alice, _spec("alice-too-long", long=True, resources={"max_seconds": 1200}))
    short = _post(alice, _spec("alice-short", resources={"max_seconds": 120}))
    jobs.update({too_long: alice, short: alice})
    assert _ended(box, alice, short)["status"] == "succeeded", box.report(short)
    # Its reason is the one the next scheduling pass gives, with the short job's slot free again (the
    # short job's end is recorded before that pass runs): it waits, or it has started past the reservation.
    blocked = _wait(
        box,
        alice,
        too_long,
        lambda j: j["status"] != "queued" or j["queue"]["reason"] == "reservation",
        "a decision on the free slot",
    )
    assert blocked["status"] == "queued" and blocked["queue"]["reason"] == "reservation", blocked
    assert _job(bob, two)["status"] == "queued"
    _cancel(box, alice, too_long)
    _cancel(box, alice, held["id"])
    _running(box, bob, two)
    _cancel(box, bob, two)

    # 4. Usage: every run's device-seconds are its devices x its wall time, and GET /usage sums them.
    for owner, c in (("alice", alice), ("bob", bob)):
        ran = [_job(c, i) for i, cl in jobs.items() if cl is c]
        ran = [j for j in ran if j["started_at"]]
        wall = sum(
            j["spec"]["resources"]["processes_per_node"]
            * (_when(j, "finished_at") - _when(j, "started_at")).total_seconds()
            for j in ran
        )
        for j in ran:
            assert (
                j["usage"] is not None
                and j["usage"]["devices"] == j["spec"]["resources"]["processes_per_node"]
            )
        rows = c.get("/usage", params={"group_by": "owner"}).json()["data"]
        assert [r["owner"] for r in rows] == [owner]
        assert rows[0]["jobs"] == len(ran)
        assert abs(rows[0]["device_seconds"] - wall) <= 0.05 * wall, (rows, wall)
        by_day = c.get("/usage", params={"group_by": "day"}).json()["data"]
        assert sum(r["device_seconds"] for r in by_day) == pytest.approx(rows[0]["device_seconds"], rel=1e-6)
        cli = run_ftq("usage", "--json", url=box.url, token=ALICE if owner == "alice" else BOB)
        assert cli.returncode == 0, cli.stderr
        assert json.loads(cli.stdout)["data"] == rows
    succeeded = _job(bob, b1)
    assert succeeded["estimate_vs_actual"]["actual_seconds"] > 0
    metrics = httpx.get(f"{box.url}/metrics").text
    assert (
        'ftq_device_seconds_total{owner="alice"}' in metrics
        and 'ftq_device_seconds_total{owner="bob"}' in metrics
    )


def test_every_dry_run_carries_a_time_estimate(box: Deployment) -> None:
    alice = _client(box, ALICE)
    for spec in (_spec("dry"), example_spec("tiny-cpu.yaml"), example_spec("llama2-70b-fsdp.yaml")):
        r = alice.post("/jobs", params={"dry_run": "true"}, json=spec)
        assert r.status_code == 200, r.text
        te = r.json()["time_estimate"]
        assert te["tokens"] and te["assumptions"], te
        assert any("FLOPs/token/parameter" in a for a in te["assumptions"])
    plan = alice.post("/jobs", params={"dry_run": "true"}, json=_spec("dry")).json()
    tiny = plan["time_estimate"]
    # The tokens the dataset preflight counted with the job's tokenizer: 3 steps of 2 sequences at the
    # data's mean length, within the bound of every sequence max_seq_len (64) long.
    assert tiny["seconds"] > 0 and tiny["tokens"] == plan["dataset"]["run_tokens"]
    assert 0 < tiny["tokens"] <= 3 * 2 * 1 * 1 * 64
