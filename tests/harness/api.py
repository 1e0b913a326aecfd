"""The harness's own calls to a deployment's API, through the project's SDK (`ftq.client.Client`).

What a test asserts about HTTP itself (status codes, headers, raw bodies) it sends with a plain httpx
client (`Deployment.http`, `Deployment.client()`); what the harness needs done (submit, look up, wait,
cancel what is left) goes through here. Jobs come back as the API's JSON (dicts), as tests read them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from ftq.client import Client, ConnectionFailed, JobStatus, Unavailable
from ftq.contract.status import ACTIVE, TERMINAL

Job = dict[str, Any]
TERMINAL_NAMES = frozenset(str(s) for s in TERMINAL)


class JobsApi:
    """Submit, read, wait for and cancel jobs on one server, as one owner (its token)."""

    def __init__(self, url: str, token: str | None, report: Callable[[str | None], str] | None = None):
        # token "" sends no Authorization header (None would fall back to FTQ_TOKEN from the environment).
        self.sdk = Client(url, token or "", timeout=30)
        self._report = report or (lambda _job_id: "")

    def close(self) -> None:
        self.sdk.close()

    def post_job(self, spec: Mapping[str, Any], *, idempotency_key: str | None = None) -> Job:
        """POST /jobs; the created job. An error answer raises the SDK's error (naming the field)."""
        return self.sdk.jobs.create(dict(spec), idempotency_key=idempotency_key).model_dump(mode="json")

    def dry_run(self, spec: Mapping[str, Any]) -> Job:
        """POST /jobs?dry_run=true; the plan (config, command, estimate). Nothing is stored."""
        return self.sdk.jobs.create(dict(spec), dry_run=True).model_dump(mode="json")

    def job(self, job_id: str, *, unavailable_for: float = 60) -> Job:
        """GET /jobs/{id}. A 503 (the store restarting: other tests restart PostgreSQL) is waited out for
        up to `unavailable_for` seconds, as the API contract asks a client to."""
        deadline = time.monotonic() + unavailable_for
        while True:
            try:
                return self.sdk.jobs.get(job_id).model_dump(mode="json")
            except Unavailable as exc:
                if time.monotonic() > deadline:
                    raise
                time.sleep(min(exc.retry_after or 1.0, 1.0))

    def cancel(self, job_id: str) -> Job:
        return self.sdk.jobs.cancel(job_id).model_dump(mode="json")

    def wait_for(
        self, job_id: str, pred: Callable[[Job], bool], timeout: float = 240, what: str = "condition"
    ) -> Job:
        """The job once `pred(job)` holds. Connection errors (a server being restarted) are waited out; a
        job that ends without `pred` holding, or the timeout, is an AssertionError with the run's report."""
        deadline = time.monotonic() + timeout
        job: Job = {}
        while time.monotonic() < deadline:
            try:
                job = self.job(job_id)
            except (ConnectionFailed, Unavailable):
                time.sleep(0.5)
                continue
            if pred(job):
                return job
            if job["status"] in TERMINAL_NAMES:
                break
            time.sleep(0.25)
        raise AssertionError(f"{what} not reached for {job_id}: {job}\n{self._report(job_id)}")

    def wait_terminal(self, job_id: str, timeout: float = 240) -> Job:
        return self.wait_for(job_id, lambda j: j["status"] in TERMINAL_NAMES, timeout, "an end")

    def active_ids(self) -> list[str]:
        return [j.id for j in self.sdk.jobs.list([JobStatus(s) for s in ACTIVE], limit=500)]

    def cancel_active(self, timeout: float = 30) -> None:
        """Cancel every active job and wait (up to `timeout` s) until each has ended: runs live in sessions
        of their own and would otherwise outlive the server."""
        ids = self.active_ids()
        for job_id in ids:
            self.sdk.jobs.cancel(job_id)
        deadline = time.monotonic() + timeout
        while ids and time.monotonic() < deadline:
            ids = [i for i in ids if self.job(i)["status"] not in TERMINAL_NAMES]
            time.sleep(0.5)
