"""The harness's reading of a deployment's logs."""

from __future__ import annotations

from tests.harness.deployment import worker_ready_lines

LOG = """\
[2026-12-02 06:30:01,000: INFO/MainProcess] Connected to redis://127.0.0.1:6379/3
[2026-12-02 06:30:01,100: INFO/MainProcess] webhooks@node1 ready.
[2026-12-02 06:30:02,200: INFO/MainProcess] celery@node1 ready.
[2026-12-02 06:30:09,000: INFO/MainProcess] webhooks@node1 ready.
"""


def test_only_the_job_worker_s_readiness_counts_not_the_webhook_sender_s() -> None:
    # `ftq up` runs two Celery workers into one log: waiting for "a worker ready" must not return when
    # the webhook sender is up while the worker that launches jobs is still starting.
    assert worker_ready_lines(LOG) == 1
    assert worker_ready_lines(LOG.replace("celery@node1 ready.", "celery@node1 starting")) == 0
    assert worker_ready_lines(LOG + "[x: INFO/MainProcess] celery@node1 ready.\n") == 2
