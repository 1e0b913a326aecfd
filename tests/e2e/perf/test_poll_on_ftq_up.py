"""The acceptance run: the tiny job trained on `ftq up` (embedded defaults: SQLite, the filesystem
broker), then 16 client threads hammering its metrics poll and `/healthz` in alternating rounds on
that server. The metrics poll keeps at least half the throughput of /healthz, with no errors.

Each round polls other `after_step` values than the last, so the poll cache (which keeps a finished
job's pages) serves repeats within a round but every round also reads the store.
"""

from __future__ import annotations

import statistics

import pytest

from tests.e2e.perf.load import THREADS, rounds_against_healthz
from tests.e2e.session import FinishedJob
from tests.harness import Deployment

pytestmark = pytest.mark.timing


def test_metrics_poll_keeps_half_of_healthz_after_training_on_ftq_up(
    server: Deployment, finished_job: FinishedJob
) -> None:
    job = server.get(f"/jobs/{finished_job.job_id}")
    assert job["status"] == "succeeded"
    points = server.get(f"/jobs/{finished_job.job_id}/metrics")["data"]
    losses = [p["loss"] for p in points if p["loss"] is not None]
    assert len(losses) >= 10 and losses[-1] < losses[0]  # the job really trained
    last = points[-1]["step"]

    auth = {"Authorization": f"Bearer {server.token}"} if server.token else {}

    def polls(r: int) -> list[str]:
        # A different window of after_step values each round: a dashboard that has caught up polls
        # near the end; one that just opened starts further back.
        return [
            f"/jobs/{finished_job.job_id}/metrics?after_step={max(-1, last - 1 - (r * THREADS + k) % last)}"
            for k in range(THREADS)
        ]

    ratios, errors = rounds_against_healthz(server.url, polls, headers=auth)
    assert not errors, errors[:5]
    ratio = statistics.median(ratios)
    assert ratio >= 0.5, f"metrics poll at {ratio:.2f}x of /healthz (want >= 0.5x); rounds {ratios}"
