"""Grading slots shared among owners (service.graders.service): bob's flood of slow graders fills his own
slots and queue, his requests past it are a 429 with Retry-After (in OpenAI's shape on /v1), alice's
graders are scored at once meanwhile, a freed slot goes to the owners in turn; and a grader too big for
the bounds is a 422 naming the field. python graders are faked here (ftq.grading.score.run_python): each
one that says `block` waits until the test lets it go."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from ftq.grading import score as scoring
from ftq.grading.sandbox import Limits
from service.graders import service
from tests.harness.inprocess import MakeClient

ALICE = {"Authorization": "Bearer tok-alice"}
BOB = {"Authorization": "Bearer tok-bob"}
EXACT = {"type": "string_check", "input": "{{sample.output_text}}", "reference": "Paris", "operation": "eq"}
SLOW = {"type": "python", "name": "slow", "source": "def grade(s, i):\n    return 1.0  # block\n"}
QUICK = {"type": "python", "name": "quick", "source": "def grade(s, i):\n    return 1.0\n"}


class FakeSandbox:
    """run_python's stand-in: a `block` grader waits for a permit (`let_go`); it counts who runs at once."""

    def __init__(self) -> None:
        self.permits = threading.Semaphore(0)
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.started: list[str] = []
        self.finished: list[str] = []

    def run_python(self, grader: str, source: str, batch: Any, limits: Limits) -> list[float]:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.started.append(str(batch[0][1].get("who", "")))
        try:
            if "block" in source:
                assert self.permits.acquire(timeout=60), "the test never let the grader go"
            return [1.0]
        finally:
            with self.lock:
                self.running -= 1
                self.finished.append(str(batch[0][1].get("who", "")))

    def let_go(self, n: int = 1) -> None:
        for _ in range(n):
            self.permits.release()


@pytest.fixture
def sandbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSandbox]:
    fake = FakeSandbox()
    monkeypatch.setattr(scoring, "run_python", fake.run_python)
    yield fake
    fake.let_go(100)  # whatever a failed test left waiting


def _app(make_client: MakeClient, **settings: str) -> Any:
    return make_client(api_tokens="tok-alice:alice,tok-bob:bob,tok-carol:carol", **settings).app


async def _until(check: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        await anyio.sleep(0.02)


def test_one_owners_flood_leaves_the_others_served(make_client: MakeClient, sandbox: FakeSandbox) -> None:
    app = _app(make_client, grader_slots="4", grader_slots_per_owner="2", grader_queue_per_owner="8")
    results: dict[str, list[httpx.Response]] = {"bob": []}
    timings: dict[str, float] = {}

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as http:

            async def bob(i: int) -> None:
                body = {"grader": SLOW, "model_sample": "x", "item": {"who": f"bob{i}"}}
                results["bob"].append(await http.post("/graders/run", json=body, headers=BOB))

            async with anyio.create_task_group() as tg:
                for i in range(10):
                    tg.start_soon(bob, i)
                # Two of bob's run, eight wait in his queue.
                await _until(lambda: service.PROCESS_LANE.counts("bob") == (2, 8))
                assert sandbox.running == 2

                # His eleventh: a 429 with Retry-After, natively and in OpenAI's shape on /v1.
                r = await http.post("/graders/run", json={"grader": SLOW, "model_sample": "x"}, headers=BOB)
                assert r.status_code == 429, r.text
                assert int(r.headers["Retry-After"]) >= 1
                assert (
                    r.json()["code"] == "rate_limited" and "FTQ_GRADER_QUEUE_PER_OWNER" in r.json()["detail"]
                )
                r = await http.post(
                    "/v1/fine_tuning/alpha/graders/run",
                    json={"grader": SLOW, "model_sample": "x"},
                    headers=BOB,
                )
                assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
                error = r.json()["error"]
                assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded", error

                # Alice meanwhile: a string_check and a python grader, each answered at once.
                for name, grader in (("string_check", EXACT), ("python", QUICK)):
                    started = time.monotonic()
                    r = await http.post(
                        "/graders/run",
                        json={"grader": grader, "model_sample": "Paris", "item": {"who": "alice"}},
                        headers=ALICE,
                    )
                    timings[name] = time.monotonic() - started
                    assert r.status_code == 200 and r.json()["reward"] == 1.0, r.text
                # And bob's own cheap grader is not stuck behind his python ones (a lane of its own).
                r = await http.post(
                    "/graders/run", json={"grader": EXACT, "model_sample": "Paris"}, headers=BOB
                )
                assert r.status_code == 200 and r.json()["reward"] == 1.0
                assert service.PROCESS_LANE.counts("bob") == (2, 8)

                sandbox.let_go(10)

    anyio.run(main)
    assert timings["string_check"] < 5 and timings["python"] < 5, timings
    assert [r.status_code for r in results["bob"]] == [200] * 10
    assert all(r.json()["reward"] == 1.0 for r in results["bob"])
    # Never more than his two slots at once (alice's quick grader made a third run at most).
    assert sandbox.most <= 3
    assert service.PROCESS_LANE.counts("bob") == (0, 0)
    assert service.PROCESS_LANE.counts("alice") == (0, 0)


def test_a_freed_slot_goes_to_the_next_owner_in_turn(make_client: MakeClient, sandbox: FakeSandbox) -> None:
    """Every slot taken (two, both bob's) and bob's queue three long: alice's and carol's requests that
    come after are scored before bob's queued ones, one each turn."""
    app = _app(make_client, grader_slots="2", grader_slots_per_owner="2", grader_queue_per_owner="8")
    headers = {**{"bob": BOB, "alice": ALICE}, "carol": {"Authorization": "Bearer tok-carol"}}

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60) as http:

            async def grade(who: str, i: int) -> None:
                body = {"grader": SLOW, "model_sample": "x", "item": {"who": f"{who}{i}"}}
                r = await http.post("/graders/run", json=body, headers=headers[who])
                assert r.status_code == 200, r.text

            async with anyio.create_task_group() as tg:
                for i in range(5):
                    tg.start_soon(grade, "bob", i)
                await _until(lambda: service.PROCESS_LANE.counts("bob") == (2, 3))
                tg.start_soon(grade, "alice", 0)
                await _until(lambda: service.PROCESS_LANE.counts("alice") == (0, 1))
                tg.start_soon(grade, "carol", 0)
                await _until(lambda: service.PROCESS_LANE.counts("carol") == (0, 1))
                # One at a time: each freed slot is given before the next is freed.
                for n in range(1, 8):
                    sandbox.let_go()
                    await _until(lambda n=n: len(sandbox.finished) == n)
                    await _until(lambda n=n: sandbox.running == min(2, 7 - n))

    anyio.run(main)
    # bob0 and bob1 held the slots; then alice and carol, in the order they came, before bob's queue.
    owners = [who.rstrip("0123456789") for who in sandbox.started]
    assert owners[:2] == ["bob", "bob"]
    assert owners[2:4] == ["alice", "carol"], owners
    assert owners[4:] == ["bob"] * 3


def test_a_request_that_leaves_gives_its_place_back() -> None:
    lane = service.Lane("test")

    async def main() -> None:
        async with lane.slot("bob", 1, 1, 4):
            assert lane.counts("bob") == (1, 0)
            with anyio.move_on_after(0.2):
                async with lane.slot("bob", 1, 1, 4):
                    pytest.fail("a second slot of one")
            assert lane.counts("bob") == (1, 0)
            # A queue of none: the request past the slots is refused at once.
            with pytest.raises(service.TooManyRequests) as e:
                async with lane.slot("bob", 1, 1, 0):
                    pass
            assert e.value.headers["Retry-After"] == "1"
        assert lane.counts("bob") == (0, 0)
        async with lane.slot("bob", 1, 1, 0):
            assert lane.counts("bob") == (1, 0)

    anyio.run(main)


def test_graders_past_the_bounds_are_refused(make_client: MakeClient, sandbox: FakeSandbox) -> None:
    api = make_client(api_tokens="tok-alice:alice")

    def multi(graders: dict[str, Any]) -> dict[str, Any]:
        return {"type": "multi", "graders": graders, "calculate_output": " + ".join(graders)}

    deep = multi({"a": multi({"b": multi({"c": EXACT})})})
    r = api.post("/graders/validate", json={"grader": deep}, headers=ALICE)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "grader", "graders"]
    assert "nest 3 deep" in r.json()["detail"][0]["msg"]
    wide = multi({f"m{i}": multi({f"g{j}": SLOW for j in range(8)}) for i in range(8)})
    r = api.post("/graders/run", json={"grader": wide, "model_sample": "x"}, headers=ALICE)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "grader", "graders"]
    assert sandbox.finished == []
    r = api.post("/graders/run", json={"grader": EXACT, "model_sample": "x" * 300_000}, headers=ALICE)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "model_sample"]
    r = api.post(
        "/v1/fine_tuning/alpha/graders/run",
        json={"grader": EXACT, "model_sample": "x", "item": {"a": "y" * 300_000}},
        headers=ALICE,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "item", r.text
    # A long field repeated by a template: the grader's error, not a gigabyte of text.
    repeat = {**EXACT, "input": "{{item.a}}" * 100}
    r = api.post(
        "/graders/run",
        json={"grader": repeat, "model_sample": "x", "item": {"a": "y" * 100_000}},
        headers=ALICE,
    )
    errors = r.json()["metadata"]["errors"]
    assert (
        r.status_code == 200
        and errors["code"] == "grader_error"
        and "renders to more than" in errors["message"]
    )
