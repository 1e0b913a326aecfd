"""The scheduler's tick writes each queued job's place for the API to read (GET /jobs/{id} `queue`), and
an ended run is accounted on the job (`usage`, `estimate_vs_actual`), in GET /usage and in /metrics; in
process on SQLite (tests/integration/store runs the store on PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ftq.contract.status import JobStatus
from ftq.store import repository
from ftq.store.db import session_scope
from tests.harness.inprocess import MakeClient
from worker import controller

ALICE, BOB = "alice-unit-token", "bob-unit-token"


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _run(job_id: str, started: datetime, ended: datetime) -> None:
    """What the controller records for a run that started and ended at these times."""
    with session_scope() as s:
        assert repository.JOBS.mark_running(s, job_id, external_id=None, pid=None, pid_start_ticks=None)
        assert repository.JOBS.mark_finished(
            s, job_id, JobStatus.succeeded, exit_code=0, run_started=started, run_ended=ended
        )


def test_queue_usage_and_estimate_vs_actual(
    make_client: MakeClient, store_url: str, tiny_job: dict[str, Any]
) -> None:
    client = make_client(
        store_url,
        api_tokens=f"{ALICE}:alice,{BOB}:bob",
        cpu_slots="1",
        max_priority="bob:normal",
        max_queued_exports_per_owner="2",
    )
    ids = []
    for token in (ALICE, ALICE, BOB):
        r = client.post("/jobs", json=tiny_job, headers=_auth(token))
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    a1, a2, b1 = ids
    assert client.get(f"/jobs/{a2}", headers=_auth(ALICE)).json()["queue"] is None  # no tick yet

    assert controller.schedule() == [controller.Claim("job", a1)]
    # alice holds the slot: bob's job is next, ahead of her older one.
    queue_b = client.get(f"/jobs/{b1}", headers=_auth(BOB)).json()["queue"]
    queue_a = client.get(f"/jobs/{a2}", headers=_auth(ALICE)).json()["queue"]
    assert (queue_b["position"], queue_b["reason"]) == (1, "no_free_devices")
    assert (queue_a["position"], queue_a["reason"]) == (2, "no_free_devices")
    assert queue_b["estimated_start"] is not None
    listed = client.get("/jobs", headers=_auth(BOB)).json()["data"]
    assert listed[0]["queue"] == queue_b
    assert client.get(f"/jobs/{a1}", headers=_auth(ALICE)).json()["queue"] is None

    # The operator's cap on bob's priority: a 422 naming the field.
    r = client.post("/jobs", json={**tiny_job, "priority": "high"}, headers=_auth(BOB))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "priority"], r.text

    start = datetime(2026, 11, 30, 23, 59, 0, tzinfo=UTC)
    _run(a1, start, start + timedelta(seconds=90))  # ends on the 1st of December
    job = client.get(f"/jobs/{a1}", headers=_auth(ALICE)).json()
    assert job["usage"] == {"devices": 1, "device_seconds": 90.0, "gpu_hours": 0.0}
    assert job["estimate_vs_actual"]["actual_seconds"] == 90.0
    assert job["estimate_vs_actual"]["estimated_seconds"] > 0

    assert controller.schedule() == [controller.Claim("job", b1)]
    assert client.get(f"/jobs/{b1}", headers=_auth(BOB)).json()["queue"] is None
    _run(b1, start, start + timedelta(seconds=30))

    usage = client.get("/usage", headers=_auth(ALICE)).json()["data"]
    assert usage == [
        {
            "owner": "alice",
            "day": None,
            "device_seconds": 90.0,
            "gpu_hours": 0.0,
            "jobs": 1,
            "exports": 0,
            "evaluations": 0,
            "deployments": 0,
            "training_clients": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
        }
    ]
    usage = client.get("/usage", params={"group_by": "day"}, headers=_auth(BOB)).json()["data"]
    assert [(u["owner"], u["jobs"], u["device_seconds"]) for u in usage] == [("bob", 1, 30.0)]
    # from/to select runs by the time they ended (the store's clock for a run given its own end: the
    # time mark_finished ran); a range before it is empty.
    empty = client.get("/usage", params={"to": "2000-01-01T00:00:00Z"}, headers=_auth(BOB)).json()["data"]
    assert empty == []
    bad = client.get("/usage", params={"from": "2026-12-01T00:00:00"}, headers=_auth(BOB))
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "from"]
    # Extreme offsets (issue 28, finding 10): a time whose UTC instant is outside what a datetime holds
    # is a 422 naming the field, not a 500 (OverflowError when compared or sent to the store).
    for name, value in (("from", "9999-12-31T23:59:59-23:59"), ("to", "0001-01-01T00:00:00+23:59")):
        extreme = client.get("/usage", params={name: value}, headers=_auth(BOB))
        assert extreme.status_code == 422, extreme.text
        assert extreme.json()["detail"][0]["loc"] == ["query", name]

    metrics = client.get("/metrics").text
    assert 'ftq_device_seconds_total{owner="alice"} 90.0' in metrics
    assert 'ftq_runs_accounted_total{owner="bob"} 1.0' in metrics
    assert 'ftq_queue_waiting{reason="no_free_devices"} 1.0' in metrics  # a2 waits

    with session_scope() as s:
        rows = {u.owner: u for u in repository.owner_usage(s)}
    assert rows["alice"].total_device_seconds == 90.0 and rows["bob"].total_jobs == 1

    # Issue 28, finding 4: exports are runs too. An owner may queue FTQ_MAX_QUEUED_EXPORTS_PER_OWNER of
    # them (then a 429 quota_exceeded naming it), and one that ran counts in /usage and owner usage.
    from ftq.runtime.settings import get_settings
    from ftq.store.exports import EXPORTS

    (get_settings().runs_dir / a1 / "final").mkdir(parents=True)
    exports = []
    for dtype in ("fp32", "bf16"):
        r = client.post(f"/jobs/{a1}/exports", json={"kind": "merged", "dtype": dtype}, headers=_auth(ALICE))
        assert r.status_code == 202, r.text
        exports.append(r.json()["id"])
    r = client.post(f"/jobs/{a1}/exports", json={"kind": "merged", "dtype": "fp16"}, headers=_auth(ALICE))
    assert r.status_code == 429 and r.json()["code"] == "quota_exceeded", r.text
    assert "FTQ_MAX_QUEUED_EXPORTS_PER_OWNER" in r.json()["detail"] and r.headers["retry-after"]
    with session_scope() as s:
        assert EXPORTS.mark_starting(s, exports[0], resources={"cpu_slots": [0]})
    with session_scope() as s:
        assert EXPORTS.mark_running(s, exports[0], external_id=None, pid=None, pid_start_ticks=None)
        assert EXPORTS.mark_finished(s, exports[0], JobStatus.succeeded, exit_code=0)
    # One fewer waits: room for one more.
    r = client.post(f"/jobs/{a1}/exports", json={"kind": "merged", "dtype": "fp16"}, headers=_auth(ALICE))
    assert r.status_code == 202, r.text
    # Its one device from launch to end (the store's clock here: a moment).
    usage = client.get("/usage", headers=_auth(ALICE)).json()["data"]
    assert [(u["jobs"], u["exports"]) for u in usage] == [(1, 1)] and usage[0]["device_seconds"] > 90.0
    assert client.get("/usage", headers=_auth(BOB)).json()["data"][0]["exports"] == 0
    with session_scope() as s:
        rows = {u.owner: u for u in repository.owner_usage(s)}
    assert rows["alice"].total_device_seconds > 90.0 and rows["alice"].total_jobs == 1
