"""GET /metrics on the shared real server: Prometheus text computed from the store."""

from __future__ import annotations

import re

import pytest

from tests.e2e.session import FinishedJob
from tests.harness import Deployment


def _value(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert match, f"{name} missing from:\n{text}"
    return float(match.group(1))


@pytest.mark.slow  # a real tiny training run
def test_prometheus_metrics_reflect_the_store(server: Deployment, finished_job: FinishedJob) -> None:
    with server.client() as c:
        resp = c.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    assert _value(text, "ftq_store_up") == 1
    total = len(server.get("/jobs", limit=500)["data"])
    by_status = {
        s: _value(text, f'ftq_jobs{{status="{s}"}}')
        for s in ("queued", "starting", "running", "cancelling", "succeeded", "failed", "cancelled")
    }
    assert sum(by_status.values()) == total  # one GROUP BY over every job
    assert by_status["succeeded"] >= 1
    # The finished job was created, dispatched and started within the last hour.
    assert 1 <= _value(text, "ftq_queue_wait_seconds_count") <= total
    count = _value(text, "ftq_queue_wait_seconds_count")
    assert _value(text, 'ftq_queue_wait_seconds_bucket{le="+Inf"}') == count
    assert _value(text, "ftq_dispatch_latency_seconds_count") >= 1
    assert _value(text, "ftq_ingest_lag_max_seconds") >= 0
    assert _value(text, "ftq_dispatch_unsent") >= 0


def test_metrics_of_an_empty_store_need_no_token(auth_server: Deployment) -> None:
    # Scrapers get aggregate counts only (no job ids or owners), so /metrics stays open under auth.
    resp = auth_server.client().get("/metrics", headers={"Authorization": ""})
    assert resp.status_code == 200
    assert _value(resp.text, "ftq_store_up") == 1
    assert _value(resp.text, 'ftq_jobs{status="queued"}') == 0
    assert _value(resp.text, "ftq_queue_wait_seconds_count") == 0
    assert "job_" not in resp.text
