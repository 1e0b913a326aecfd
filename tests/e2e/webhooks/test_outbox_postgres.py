"""The webhook outbox on the production stack: `ftq api` and `ftq worker` as separate processes on
PostgreSQL and Redis (Celery's beat drives the sender). The tiny job's events reach a receiver on
127.0.0.1, each signed, all of them, in the job's order; the worker is killed while the job runs and
started again, and still nothing is lost."""

from __future__ import annotations

import pytest

from tests.e2e.webhooks.test_webhooks import TYPES, api_events, first_receipts, learning_job
from tests.harness import Deployment, tiny_assets
from tests.harness.deployment import QUICK_SETTINGS
from tests.harness.webhooks import Receiver, signature_valid

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def test_outbox_on_postgres_redis_and_celery(tmp_path_factory: pytest.TempPathFactory) -> None:
    tiny_assets()
    receiver = Receiver().start()
    settings = {
        **QUICK_SETTINGS,
        "webhook_allowed_networks": "127.0.0.1/32",
        "webhook_interval_seconds": 0.5,
        "webhook_retry_base_seconds": 1,
        "webhook_retry_max_delay_seconds": 2,
    }
    root = tmp_path_factory.mktemp("outbox-pg")
    try:
        with Deployment(
            root,
            mode="api+worker",
            store="postgres",
            broker="redis",
            tokens={"carol": "carol-token"},
            settings=settings,
        ) as dep:
            r = dep.http.post("/webhooks", json={"url": receiver.url, "events": TYPES})
            assert r.status_code == 201, r.text
            secret = r.json()["secret"]
            job_id = dep.post_job(learning_job())["id"]
            dep.wait_for(job_id, lambda j: j["status"] == "running", timeout=300, what="running")
            # The worker dies mid-run and comes back: the outbox rows wait for it in PostgreSQL.
            dep.kill_worker()
            dep.start_worker()
            job = dep.wait_terminal(job_id, timeout=400)
            assert job["status"] == "succeeded", dep.report(job_id)
            got = first_receipts(receiver.wait_for(job_id, "job.succeeded", timeout=120))
            types = [d.type for d in got]
            for wanted in ("job.queued", "job.started", "job.checkpoint", "job.eval", "job.succeeded"):
                assert wanted in types, types
            events = [e for e in api_events(dep.http, job_id) if e["type"] in TYPES]
            assert [d.seq for d in got] == [e["id"] for e in events]
            assert all(signature_valid(secret, d) for d in receiver.of(job_id))
    finally:
        receiver.stop()
