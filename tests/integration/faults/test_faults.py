"""Faults with real processes: one job trains through a PostgreSQL restart, a Redis restart and an API
SIGKILL on the production setup, and through a SIGKILL of `ftq up` on the embedded one (tokens on).
Each job must end succeeded, with every metric point, launched exactly once.

The long series (50 faults per setup, many jobs) is bench/fault_series.py. The SIGKILL of the worker
mid-run and a POST while Redis is down are in tests/integration/worker/test_runtime_production.py;
`ftq up` killed mid-run without tokens in tests/integration/worker/test_runtime_embedded.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from ftq.client import Client
from tests.harness import Deployment, Paced, postgres, proc_groups, run_pids, tiny_spec, wait_gone
from tests.harness.api import TERMINAL_NAMES as TERMINAL

# Not serial: the PostgreSQL it stops is a server of its own (conftest.py `private_postgres`).
pytestmark = pytest.mark.slow

TRAINER_START = "trainer INFO strategy"  # once per trainer process start


def assert_whole_run(stack: Deployment, job_id: str, max_steps: int) -> None:
    """Succeeded, every step's point stored and `complete`, and launched exactly once."""
    job = stack.wait_terminal(job_id, timeout=600)
    assert job["status"] == "succeeded", stack.report(job_id)
    page = stack.http.get(f"/jobs/{job_id}/metrics", params={"limit": 10_000}).json()
    assert [p["step"] for p in page["data"]] == list(range(1, max_steps + 1)) and page["complete"], page
    assert job["progress"]["step"] == max_steps
    run_dir = stack.run_dir(job_id)
    # One line per start of launch.sh (the local launcher appends it), one trainer start in the log,
    # and no step written twice: a second launch would show in each.
    assert len((run_dir / "launches.log").read_text().splitlines()) == 1
    assert (run_dir / "train.log").read_text(errors="replace").count(TRAINER_START) == 1
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == max_steps
    assert run_pids(job_id) == []


def still_running(stack: Deployment, job_id: str) -> dict[str, Any]:
    job = stack.job(job_id)
    assert job["status"] not in TERMINAL, f"the run ended before the fault: {job}"
    return job


def post_until_created(stack: Deployment, spec: dict[str, Any], key: str, timeout: float = 60) -> str:
    """What a client does: retry on connection errors and 503 with the same Idempotency-Key."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            r = stack.http.post("/jobs", json=spec, headers={"Idempotency-Key": key})
        except httpx.TransportError:
            time.sleep(0.5)
            continue
        assert r.status_code in (201, 503), r.text
        if r.status_code == 201:
            return str(r.json()["id"])
        time.sleep(0.5)
    raise AssertionError("POST never accepted")


# Still training after the three faults: they take about 20 s, which unpaced took about 600 steps
# whether the machine was quiet or busy (the restarts slow down as the steps do). Paced (a tenth of the
# CPU time, tests.harness.Paced) from its first point until the API is back, the run takes about 100
# steps over them on a quiet machine and fewer on a busy one, then trains the rest at full speed: the
# steps that only kept it busy are CPU the rest of the suite no longer waits for.
MAIN_STEPS = 300
SIDE_STEPS = 4


@pytest.mark.postgres
@pytest.mark.redis
def test_production_job_trains_through_pg_redis_and_api_restarts(
    embedded_flow: Future[None],
    production_stack: Deployment,
    private_postgres: postgres.PrivatePostgres,
    tiny_dir: Path,
) -> None:
    stack = production_stack
    job_id = post_until_created(stack, tiny_spec(tiny_dir, max_steps=MAIN_STEPS, name="through"), "main-job")
    stack.wait_for(job_id, lambda j: (j["progress"]["step"] or 0) >= 1, 300, "first point")
    # Paced from here until the API is back (MAIN_STEPS).
    with Paced(job_id):
        api_pid = stack.pid("api")

        # PostgreSQL stops: every answer meanwhile is a 503 (the store is unreachable), never a 500; a POST
        # is refused with 503 too, and the client's retry with the same key goes through once it is back.
        still_running(stack, job_id)
        side_spec = tiny_spec(tiny_dir, max_steps=SIDE_STEPS, name="side")

        def get_and_post() -> str:
            got = stack.http.get(f"/jobs/{job_id}").status_code
            posted = stack.http.post("/jobs", json=side_spec, headers={"Idempotency-Key": "side"}).status_code
            return f"{got},{posted}"

        try:
            private_postgres.stop()
            down, back = postgres.answers_while_down(get_and_post, 4, private_postgres.is_up)
        finally:
            private_postgres.start()
        # (Answers after the server was back are no evidence of the outage; never a 500.)
        assert sum(down.values()) >= 2 and set(down) == {"503,503"}, (down, back)
        assert all(c == "503" or not c.startswith("5") for answer in back for c in answer.split(",")), back
        # The API comes back by itself (same process, no restart).
        stack.wait_for(job_id, lambda j: True, 30, "API answers again")
        assert stack.pids().get("api") == api_pid
        side_id = post_until_created(stack, side_spec, "side")
        assert post_until_created(stack, side_spec, "side") == side_id

        # Redis stops and comes back: the worker's consumer recovers, so ingest goes on.
        step = still_running(stack, job_id)["progress"]["step"] or 0
        assert stack.redis is not None
        try:
            stack.redis.stop()
            time.sleep(3)
        finally:
            stack.redis.start()
        stack.wait_for(
            job_id,
            lambda j: (j["progress"]["step"] or 0) > step or j["status"] == "succeeded",
            120,
            "progress after the Redis restart",
        )

        # The API is SIGKILLed and started again.
        still_running(stack, job_id)
        stack.kill9("api")
        stack.start_server()

    assert_whole_run(stack, job_id, MAIN_STEPS)
    assert_whole_run(stack, side_id, SIDE_STEPS)


# Still training when `ftq up` is killed, a second or two after the first point is seen: paced from that
# point until the restarted server answers (about 10 steps a second on a quiet machine), then at full
# speed. Unpaced it took 400 steps (8 s of training on a quiet machine, 20 s in the suite). Whether the run
# ends while `ftq up` is down or after the restart, the restarted worker takes it over. It runs alongside
# the production test, not after it.
UP_STEPS = 100


class Answered(httpx.HTTPTransport):
    """A transport that notes the first answer it got."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.answered.set()
        return response


def _through_kill9_of_ftq_up(stack: Deployment, tiny_dir: Path) -> None:
    job_id = post_until_created(stack, tiny_spec(tiny_dir, max_steps=UP_STEPS, name="through-up"), "up-job")
    stack.wait_for(job_id, lambda j: (j["progress"]["step"] or 0) >= 1, 300, "first point")
    up_pid = stack.pid("up")
    worker_pids = [p for p in proc_groups().get(up_pid, []) if p != up_pid]
    still_running(stack, job_id)
    # An internal tool waits for the job and follows its log through the restart, with the SDK alone.
    seen = [Answered(), Answered()]
    waiter, follower = (Client(stack.url, stack.token or "", transport=t) for t in seen)
    with Paced(job_id) as pace, waiter, follower, ThreadPoolExecutor(max_workers=2) as pool:
        waited = pool.submit(waiter.jobs.wait, job_id, timeout=600, poll=0.5)
        followed = pool.submit(lambda: list(follower.jobs.logs(job_id, follow=True, poll=0.5)))
        # Both have had an answer (a first refusal would rightly be a wrong URL to them, not a restart).
        assert all(t.answered.wait(60) for t in seen)
        stack.kill9("up")
        wait_gone(worker_pids)  # the worker follows `ftq up` down; the run does not
        stack.start_server()
        pace.stop()
        # Tokens still guard the restarted server, and the job is still its owner's.
        assert httpx.get(f"{stack.url}/jobs/{job_id}").status_code == 401
        assert stack.job(job_id)["owner"] == "faults"
        assert_whole_run(stack, job_id, UP_STEPS)
        assert waited.result(timeout=120).status == "succeeded"
        # Every line once, in order, across the dropped stream and the refused reconnects.
        assert followed.result(timeout=120) == list(waiter.jobs.logs(job_id))


@pytest.fixture(scope="module")
def embedded_flow(embedded_stack: Deployment, tiny_dir: Path) -> Iterator[Future[None]]:
    """The embedded flow runs in a thread from the start of the module: it touches neither PostgreSQL
    nor Redis, so it overlaps the production test instead of adding its start-up and training time."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(_through_kill9_of_ftq_up, embedded_stack, tiny_dir)


def test_embedded_job_trains_through_kill9_of_ftq_up_with_tokens(embedded_flow: Future[None]) -> None:
    embedded_flow.result(timeout=600)
