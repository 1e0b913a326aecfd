"""Events and webhooks on a real `ftq up`, with receivers on 127.0.0.1 (http.server threads in this test).

One deployment and three jobs serve the module (they train at the same time):
- alice's tiny job (checkpoints and evals), whose deliveries reach a receiver that is up;
- bob's tiny job, whose receiver is down until its deliveries have been retried a few times, then up;
- alice's job with a learning rate that makes its loss explode, which ends `failed` with `diverged`;
- mallory's 40 webhooks at a receiver that trickles one header byte at a time and never ends its answer
  (issue 28, finding 2), set up before the others' jobs: they must still be placed, run and be delivered.

The operator allowlists loopback (FTQ_WEBHOOK_ALLOWED_NETWORKS: the deployment runs with FTQ_ENV=test,
where loopback is refused otherwise) and scales the retry schedule down to seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import TINY_RELATIVE, Deployment, run_ftq, tiny_assets, tiny_spec
from tests.harness.api import JobsApi
from tests.harness.deployment import QUICK_SETTINGS
from tests.harness.webhooks import Delivery, Receiver, signature_valid

ALICE, BOB, MALLORY = "alice-webhooks-token", "bob-webhooks-token", "mallory-webhooks-token"
TRICKLING_HOOKS = 40
TYPES = [
    "job.queued",
    "job.started",
    "job.checkpoint",
    "job.eval",
    "job.warning",
    "job.retried",
    "job.succeeded",
    "job.failed",
    "job.cancelled",
]


@dataclass
class Scenario:
    dep: Deployment
    alice: httpx.Client
    bob: httpx.Client
    up: Receiver
    down: Receiver
    alice_hook: dict[str, Any]
    bob_hook: dict[str, Any]
    alice_job: str
    bob_job: str
    diverged_job: str
    mallory: httpx.Client
    mallory_job: str


def learning_job() -> dict[str, Any]:
    spec = tiny_spec(TINY_RELATIVE, name="hooks", max_steps=4, save_steps=2, eval_steps=2)
    spec["dataset"]["eval_split"] = "eval"
    return spec


def diverging_job() -> dict[str, Any]:
    # Full fine-tuning at learning rate 1.0 with no clipping: the tiny model's loss climbs to over four
    # times its first value within a few steps and stays there.
    spec = tiny_spec(
        TINY_RELATIVE,
        name="diverges",
        max_steps=16,
        save_steps=2,
        learning_rate=1.0,
        max_grad_norm=0.0,
        warmup_ratio=0.0,
        lr_scheduler_type="constant",
    )
    spec["lora"] = None
    return spec


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    tiny_assets()
    settings = {
        **QUICK_SETTINGS,
        "webhook_allowed_networks": "127.0.0.0/8",
        "webhook_interval_seconds": 0.5,
        "webhook_retry_base_seconds": 1,
        "webhook_retry_max_delay_seconds": 2,
        "webhook_retry_total_seconds": 600,
        "max_webhooks_per_owner": TRICKLING_HOOKS,
    }
    up, down = Receiver().start(), Receiver()  # `down` has its port, nothing listens there yet
    root = tmp_path_factory.mktemp("webhooks")
    from tests.unit.ftq.runtime.test_outbound import Trickler

    trickler = Trickler(every=3.0)  # `HTTP/1.1 200 OK\r\nX-A: ` then one byte every 3 s, forever
    tokens = {"alice": ALICE, "bob": BOB, "mallory": MALLORY}
    with Deployment(root, mode="up", tokens=tokens, settings=settings) as dep:
        alice, bob, mallory = dep.client(ALICE), dep.client(BOB), dep.client(MALLORY)
        try:
            for i in range(TRICKLING_HOOKS):
                url = f"http://127.0.0.1:{trickler.port}/slow/{i}"
                r = mallory.post("/webhooks", json={"url": url, "events": ["job.queued", "job.cancelled"]})
                assert r.status_code == 201, r.text
            mallory_job = JobsApi(dep.url, MALLORY).post_job(learning_job())["id"]
            assert mallory.post(f"/jobs/{mallory_job}/cancel").status_code == 202
            r = alice.post("/webhooks", json={"url": up.url, "events": TYPES})
            assert r.status_code == 201, r.text
            alice_hook = r.json()
            r = bob.post("/webhooks", json={"url": down.url, "events": TYPES})
            assert r.status_code == 201, r.text
            bob_hook = r.json()
            alice_job = dep.post_job(learning_job())["id"]
            bob_job = JobsApi(dep.url, BOB).post_job(learning_job())["id"]
            diverged_job = dep.post_job(diverging_job())["id"]
            yield Scenario(
                dep,
                alice,
                bob,
                up,
                down,
                alice_hook,
                bob_hook,
                alice_job,
                bob_job,
                diverged_job,
                mallory,
                mallory_job,
            )
        finally:
            trickler.close()
            alice.close()
            bob.close()
            mallory.close()
            up.stop()
            down.stop()
            dep.close(cancel_active=True)


def api_events(client: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    r = client.get(f"/jobs/{job_id}/events", params={"after": 0, "limit": 1000})
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def first_receipts(deliveries: list[Delivery]) -> list[Delivery]:
    """Each event once, at its first delivery (a retry may deliver one twice: at least once)."""
    seen: set[str] = set()
    out = []
    for d in deliveries:
        if d.headers["webhook-id"] not in seen:
            seen.add(d.headers["webhook-id"])
            out.append(d)
    return out


def test_webhook_is_created_with_its_secret_once(scenario: Scenario) -> None:
    hook = scenario.alice_hook
    assert hook["id"].startswith("wh_") and hook["enabled"] is True and hook["events"] == TYPES
    assert hook["secret"].startswith("whsec_")
    got = scenario.alice.get(f"/webhooks/{hook['id']}").json()
    assert got["secret"] is None and got["url"] == scenario.up.url
    listed = scenario.alice.get("/webhooks").json()["data"]
    assert [h["id"] for h in listed] == [hook["id"]] and listed[0]["secret"] is None


def test_the_tiny_job_delivers_signed_events_in_order(scenario: Scenario) -> None:
    job = scenario.dep.wait_terminal(scenario.alice_job, timeout=400)
    assert job["status"] == "succeeded", scenario.dep.report(scenario.alice_job)
    got = first_receipts(scenario.up.wait_for(scenario.alice_job, "job.succeeded"))
    types = [d.type for d in got]
    for wanted in ("job.queued", "job.started", "job.checkpoint", "job.eval", "job.succeeded"):
        assert wanted in types, types
    assert types[0] == "job.queued" and types[-1] == "job.succeeded"
    assert types.index("job.started") < types.index("job.checkpoint") < types.index("job.succeeded")
    assert [d.seq for d in got] == sorted(d.seq for d in got)
    for d in scenario.up.of(scenario.alice_job):
        assert signature_valid(scenario.alice_hook["secret"], d), d.headers
    started = next(d.json["data"] for d in got if d.type == "job.started")
    assert started["launcher"] == "local" and started["host"] and started["num_nodes"] == 1
    queued = next(d.json["data"] for d in got if d.type == "job.queued")
    assert queued["position"] >= 1
    checkpoint = next(d.json["data"] for d in got if d.type == "job.checkpoint")
    assert checkpoint["path"].startswith("checkpoints/checkpoint-")
    evaluated = next(d.json["data"] for d in got if d.type == "job.eval")
    assert evaluated["metrics"]["eval_loss"] > 0

    # The API serves the same log, and the delivery log records each with its status code.
    events = api_events(scenario.alice, scenario.alice_job)
    assert [e["type"] for e in events][:2] == ["job.created", "job.queued"]
    assert {e["id"] for e in events if e["type"] in TYPES} == {d.seq for d in got}
    r = scenario.alice.get(f"/webhooks/{scenario.alice_hook['id']}/deliveries", params={"limit": 1000})
    mine = [d for d in r.json()["data"] if d["job_id"] == scenario.alice_job]
    assert mine and all(d["status"] == "succeeded" and d["last_status_code"] == 204 for d in mine)
    assert all(d["webhook_id_header"] == f"evt_{d['event_id']}" for d in mine)

    # `ftq events` prints them.
    cli = run_ftq("events", scenario.alice_job, url=scenario.dep.url, token=ALICE)
    assert cli.returncode == 0, cli.stderr
    assert "job.checkpoint" in cli.stdout and "job.succeeded" in cli.stdout
    # `ftq logs --follow`: the log on stdout, as it is; the events on stderr.
    cli = run_ftq("logs", scenario.alice_job, "--follow", url=scenario.dep.url, token=ALICE)
    assert cli.returncode == 0, cli.stderr
    text = scenario.alice.get(f"/jobs/{scenario.alice_job}/logs", params={"limit": 1048576}).json()["text"]
    assert cli.stdout == text
    for n, e in enumerate(events, 1):  # numbered within the job, not by the server's id
        assert f"event {n}  {e['type']}" in cli.stderr, cli.stderr


def test_trickling_receivers_of_one_owner_stall_no_other_owner(scenario: Scenario) -> None:
    """Issue 28, finding 2: mallory's 40 receivers trickle their answers and never end them. The report
    saw every worker thread held by webhook passes and other owners' jobs stay queued; now the sender has
    its own queue and process, slots per owner and one deadline per request: the others' jobs are
    placed and run (a generous bound), and mallory's deliveries end in the same opaque failure, retried.
    Before the fix this test fails at `tried` (no attempt on a trickling receiver ever ended); the stall
    itself did not show in this setup (the pass that never ends: tests/unit/worker/test_webhooks.py)."""
    for api, job_id in (
        (JobsApi(scenario.dep.url, ALICE), scenario.alice_job),
        (JobsApi(scenario.dep.url, BOB), scenario.bob_job),
    ):
        job = api.wait_terminal(job_id, timeout=400)
        assert job["status"] == "succeeded", scenario.dep.report(job_id)
    hooks = scenario.mallory.get("/webhooks", params={"limit": 100}).json()["data"]
    assert len(hooks) == TRICKLING_HOOKS
    # An attempt is recorded when its deadline ends it, which may come after the jobs' own end on a busy
    # machine: wait for one (a generous bound).
    tried: list[dict[str, Any]] = []
    deadline = time.monotonic() + 120
    while not tried and time.monotonic() < deadline:
        for hook in hooks[:10]:
            log = scenario.mallory.get(f"/webhooks/{hook['id']}/deliveries").json()["data"]
            tried += [d for d in log if d["attempts"] > 0]
        if not tried:
            time.sleep(1)
    assert tried, "none of the trickling receivers was tried"
    assert all(d["last_status_code"] is None and "did not accept" in d["last_error"] for d in tried), tried


def test_a_receiver_down_for_a_while_loses_nothing_and_keeps_order(scenario: Scenario) -> None:
    job = JobsApi(scenario.dep.url, BOB).wait_terminal(scenario.bob_job, timeout=400)
    assert job["status"] == "succeeded"
    hook = scenario.bob_hook["id"]
    deadline = time.monotonic() + 120
    retried: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not retried:
        log = scenario.bob.get(f"/webhooks/{hook}/deliveries", params={"limit": 1000}).json()["data"]
        retried = [d for d in log if d["status"] == "pending" and d["attempts"] >= 3]
        time.sleep(0.5)
    assert retried, "the deliveries to the receiver that is down were not retried"
    assert retried[0]["last_status_code"] is None and retried[0]["last_error"]
    assert retried[0]["next_attempt_at"] is not None
    scenario.down.start()  # the receiver comes back on its port
    got = first_receipts(scenario.down.wait_for(scenario.bob_job, "job.succeeded", timeout=120))
    events = [e for e in api_events(scenario.bob, scenario.bob_job) if e["type"] in TYPES]
    assert [d.seq for d in got] == [e["id"] for e in events]  # all of them, in the job's order
    for d in scenario.down.received:
        assert signature_valid(scenario.bob_hook["secret"], d)
    log = scenario.bob.get(f"/webhooks/{hook}/deliveries", params={"limit": 1000}).json()["data"]
    assert all(d["status"] == "succeeded" for d in log)
    assert max(d["attempts"] for d in log) >= 3


def test_an_exploding_loss_ends_diverged_after_a_warning(scenario: Scenario, tmp_path: Path) -> None:
    job = scenario.dep.wait_terminal(scenario.diverged_job, timeout=400)
    report = scenario.dep.report(scenario.diverged_job)
    assert job["status"] == "failed" and job["error"]["code"] == "diverged", report
    assert "learning_rate" in job["error"]["message"]
    events = api_events(scenario.alice, scenario.diverged_job)
    types = [e["type"] for e in events]
    assert "job.warning" in types and types[-1] == "job.failed", types
    warning = next(e for e in events if e["type"] == "job.warning" and e["data"]["kind"] == "loss_exploding")
    assert types.index("job.warning") < types.index("job.failed")
    assert events[-1]["data"]["error"]["code"] == "diverged"
    # No checkpoint from the step that diverged on, and no final model: the last good one stays.
    run_dir = scenario.dep.run_dir(scenario.diverged_job)
    steps = sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("checkpoint-*"))
    assert steps and max(steps) < warning["data"]["step"], steps
    assert not (run_dir / "final").exists()
    # The receiver got the warning before the failure.
    got = [d.type for d in first_receipts(scenario.up.wait_for(scenario.diverged_job, "job.failed"))]
    assert got.index("job.warning") < got.index("job.failed")


def test_events_and_webhooks_are_the_owners_alone(scenario: Scenario) -> None:
    hook = scenario.alice_hook["id"]
    assert scenario.bob.get(f"/jobs/{scenario.alice_job}/events").status_code == 404
    assert scenario.bob.get(f"/webhooks/{hook}").status_code == 404
    assert scenario.bob.get(f"/webhooks/{hook}/deliveries").status_code == 404
    assert scenario.bob.post(f"/webhooks/{hook}/rotate-secret").status_code == 404
    assert scenario.bob.post(f"/webhooks/{hook}/enable").status_code == 404
    assert scenario.bob.delete(f"/webhooks/{hook}").status_code == 404
    assert [h["id"] for h in scenario.bob.get("/webhooks").json()["data"]] == [scenario.bob_hook["id"]]
    bobs = scenario.bob.get("/events", params={"limit": 1000}).json()["data"]
    assert bobs and {e["job_id"] for e in bobs} == {scenario.bob_job}
    alices = scenario.alice.get("/events", params={"limit": 1000}).json()["data"]
    assert scenario.bob_job not in {e["job_id"] for e in alices}
    ids = [e["id"] for e in alices]
    assert ids == sorted(ids)
    # Paging by cursor: after the first event, the rest.
    page = scenario.alice.get("/events", params={"after": ids[0], "limit": 2}).json()
    assert [e["id"] for e in page["data"]] == ids[1:3] and page["next_after"] == ids[2]
    assert scenario.dep.client().get("/events").status_code == 401


def test_bad_webhooks_are_refused_naming_the_field(scenario: Scenario) -> None:
    for body, loc in [
        ({"url": "ftp://127.0.0.1/x", "events": ["job.failed"]}, "url"),
        ({"url": "http://169.254.169.254/latest", "events": ["job.failed"]}, "url"),
        ({"url": "http://10.1.2.3/x", "events": ["job.failed"]}, "url"),
        ({"url": scenario.up.url, "events": ["job.exploded"]}, "events"),
        ({"url": scenario.up.url, "events": []}, "events"),
        ({"url": scenario.up.url}, "events"),
    ]:
        r = scenario.alice.post("/webhooks", json=body)
        assert r.status_code == 422, (body, r.text)
        assert loc in {str(p) for e in r.json()["detail"] for p in e["loc"]}, r.text


def test_rotate_delete_and_enable(scenario: Scenario) -> None:
    r = scenario.alice.post("/webhooks", json={"url": scenario.up.url, "events": ["job.cancelled"]})
    hook = r.json()
    rotated = scenario.alice.post(f"/webhooks/{hook['id']}/rotate-secret").json()
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != hook["secret"]
    enabled = scenario.alice.post(f"/webhooks/{hook['id']}/enable").json()
    assert enabled["enabled"] is True and enabled["secret"] is None
    assert scenario.alice.delete(f"/webhooks/{hook['id']}").status_code == 204
    assert scenario.alice.get(f"/webhooks/{hook['id']}").status_code == 404


def test_loopback_is_refused_without_the_operators_allowlist(auth_server: Deployment) -> None:
    # FTQ_ENV=test (not development) and no FTQ_WEBHOOK_ALLOWED_NETWORKS: loopback and private are refused.
    with auth_server.client(auth_server.token) as client:
        for url in (
            "http://127.0.0.1:9/x",
            "http://localhost:9/x",
            "http://[::1]:9/x",
            "http://192.168.1.1/",
        ):
            r = client.post("/webhooks", json={"url": url, "events": ["job.failed"]})
            assert r.status_code == 422, r.text
            assert r.json()["detail"][0]["loc"] == ["body", "url"]
