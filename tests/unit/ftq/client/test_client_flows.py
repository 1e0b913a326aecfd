"""The SDK's calls as flows (`ftq.client._api`, `_plan`), run step by step in the test: what each asks
for, what it does with each answer or failure. Both clients run these same flows; the e2e tests in
tests/e2e/client run them against real servers."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pydantic
import pytest

from ftq.client import _api
from ftq.client._plan import Call, Flow, Next, Open, Run, Sleep, Step
from ftq.client.errors import (
    ConnectionFailed,
    ConnectionLost,
    NotFound,
    ServerTimeout,
    Unavailable,
    WaitTimeout,
)
from ftq.contract.schemas import (
    Event,
    EventPage,
    LogChunk,
    MetricsPage,
    Point,
    SamplePublic,
    SamplesPage,
)


def drive(flow: Flow[Any, Any], answer: Callable[[Step], Any]) -> tuple[list[Any], Any, list[Step]]:
    """Run `flow` as a client would, each step answered by `answer` (which may raise): (items, result,
    steps)."""
    run = Run(flow)
    items: list[Any] = []
    steps: list[Step] = []
    for out in run:
        if not isinstance(out, Step):
            items.append(out)
            continue
        steps.append(out)
        try:
            run.answer(answer(out))
        except Exception as exc:
            run.fail(exc)
    return items, run.result, steps


class Page(pydantic.BaseModel):
    data: list[int]
    next_cursor: str | None


class Thing(pydantic.BaseModel):
    status: str


def test_pages_by_cursor_follows_next_cursor_until_a_page_has_none() -> None:
    pages = {
        None: Page(data=[1, 2], next_cursor="7"),
        "7": Page(data=[3], next_cursor="4"),
        "4": Page(data=[], next_cursor=None),
    }
    flow = _api.pages_by_cursor(lambda cursor: Call("GET", "/things", _api.reads(Page), {"cursor": cursor}))
    items, _, steps = drive(flow, lambda step: pages[step.params["cursor"]])  # type: ignore[attr-defined]
    assert items == [1, 2, 3]
    assert [s.params["cursor"] for s in steps if isinstance(s, Call)] == [None, "7", "4"]


def test_metrics_pages_stop_once_caught_up_and_follow_sleeps_until_complete() -> None:
    def page(after: int, steps: list[int], complete: bool) -> MetricsPage:
        return MetricsPage(
            data=[Point(step=s, epoch=0.0) for s in steps],
            next_after_step=max(steps, default=after),
            complete=complete,
        )

    answers = [page(-1, [1, 2], False), page(2, [3], False), page(3, [], False), page(3, [4], True)]

    def answer(step: Step) -> Any:
        return None if isinstance(step, Sleep) else answers.pop(0)

    # Without follow: two full pages, then a short one means what is there was read.
    items, _, steps = drive(_api.iter_metrics("job_1", -1, False, 0.5, page_size=2), answer)
    assert [p.step for p in items] == [1, 2, 3]
    assert [s.params["after_step"] for s in steps if isinstance(s, Call)] == [-1, 2]

    answers[:] = [page(-1, [1], False), page(1, [], False), page(1, [2], True)]
    items, _, steps = drive(_api.iter_metrics("job_1", -1, True, 0.5, page_size=2), answer)
    assert [p.step for p in items] == [1, 2]
    assert [type(s) for s in steps] == [Call, Sleep, Call, Sleep, Call]
    assert [s.params["after_step"] for s in steps if isinstance(s, Call)] == [-1, 1, 1]


def test_samples_pages_count_steps_not_samples() -> None:
    two_prompts = [SamplePublic(step=5, index=i, prompt=p, completion="...") for i, p in enumerate("ab")]
    pages = [
        SamplesPage(data=two_prompts, next_after_step=5, complete=False),
        SamplesPage(data=[], next_after_step=5, complete=False),
    ]
    items, _, steps = drive(
        _api.iter_samples("job_1", -1, False, 0.5, page_size=2), lambda step: pages.pop(0)
    )
    assert items == two_prompts
    assert len(steps) == 1  # one step of the two a page may hold: what is there was read


def test_events_pages_stop_at_a_short_page_and_follow_reads_once_more_after_the_job_ended() -> None:
    def page(*ids: int) -> EventPage:
        at = datetime(2026, 1, 1, tzinfo=UTC)
        return EventPage(
            data=[Event(id=i, job_id="job_1", type="job.eval", time=at, data={}) for i in ids],
            next_after=max(ids, default=0),
        )

    def asked(steps: list[Step]) -> list[Any]:
        return [s.params.get("after", s.path) for s in steps if isinstance(s, Call)]

    answers: list[Any] = [page(1, 2), page(3)]
    items, _, steps = drive(_api.iter_events("job_1", 0, False, 0.5, page_size=2), answering(answers))
    assert [e.id for e in items] == [1, 2, 3] and answers == []
    assert asked(steps) == [0, 2]  # a full page, then a short one: what is there was read

    # The status is read before the events, so the events read after the job was seen ended hold its last.
    answers = [Thing(status="running"), page(4), Thing(status="succeeded"), page(5, 6), page()]
    items, _, steps = drive(_api.iter_events("job_1", 3, True, 0.5, page_size=2), answering(answers))
    assert [e.id for e in items] == [4, 5, 6] and answers == []
    assert asked(steps) == ["/jobs/job_1", 3, "/jobs/job_1", 4, 6]
    assert [s.seconds for s in steps if isinstance(s, Sleep)] == [0.5]


def test_wait_until_waits_out_a_503_and_returns_what_is_done() -> None:
    answers: list[Any] = [
        Thing(status="running"),
        Unavailable(503, "unavailable", "the store is restarting", retry_after=7.0),
        Thing(status="done"),
    ]

    def answer(step: Step) -> Any:
        if isinstance(step, Sleep):
            return None
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    get = Call("GET", "/things/1", _api.reads(Thing))
    _, result, steps = drive(
        _api.wait_until(get, lambda t: t.status == "done", lambda t: TimeoutError(), None, 1.5), answer
    )
    assert result == Thing(status="done")
    assert [s.seconds for s in steps if isinstance(s, Sleep)] == [1.5, 7.0]  # the poll, then Retry-After


def answering(answers: list[Any], clock: list[float] | None = None) -> Callable[[Step], Any]:
    """Answer each request with the next of `answers` (raised when an exception); a sleep moves `clock`."""

    def answer(step: Step) -> Any:
        if isinstance(step, Sleep):
            if clock is not None:
                clock[0] += step.seconds
            return None
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    return answer


URL = "http://127.0.0.1:9"


def test_wait_until_rides_out_a_restart_once_the_server_has_answered() -> None:
    # What a wait sees while `ftq up` restarts: a timeout, a dropped connection, refused connections.
    answers: list[Any] = [
        Thing(status="running"),
        ServerTimeout(URL),
        ConnectionLost(URL, "connection reset"),
        ConnectionFailed(URL, "connection refused"),
        Thing(status="done"),
    ]
    get = Call("GET", "/things/1", _api.reads(Thing))
    flow = _api.wait_until(get, lambda t: t.status == "done", lambda t: TimeoutError(), None, 2.0)
    _, result, steps = drive(flow, answering(answers))
    assert result == Thing(status="done") and answers == []
    assert [s.seconds for s in steps if isinstance(s, Sleep)] == [2.0, 2.0, 2.0, 2.0]


def test_wait_until_does_not_wait_for_a_server_that_never_answered() -> None:
    # A refused first request is a wrong URL or a server not started: said at once, not after minutes.
    get = Call("GET", "/things/1", _api.reads(Thing))
    flow = _api.wait_until(get, lambda t: True, lambda t: TimeoutError(), None, 1.0)
    with pytest.raises(ConnectionFailed):
        drive(flow, answering([ConnectionFailed(URL, "connection refused")]))


def test_wait_until_gives_up_on_an_outage_longer_than_its_patience(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(_api.time, "monotonic", lambda: clock[0])
    answers: list[Any] = [Thing(status="running")] + [ServerTimeout(URL) for _ in range(100)]
    get = Call("GET", "/things/1", _api.reads(Thing))
    flow = _api.wait_until(get, lambda t: False, lambda t: TimeoutError(), None, 60.0)
    with pytest.raises(ServerTimeout):
        drive(flow, answering(answers, clock))
    # Polled every 60 s: the outage began at 60 s and was given up at 420 s, past the 300 s of patience.
    assert len(answers) == 100 - 7 and clock[0] == 420.0


def test_wait_until_ends_an_outage_at_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(_api.time, "monotonic", lambda: clock[0])
    answers: list[Any] = [Thing(status="running")] + [ConnectionLost(URL, "reset") for _ in range(10)]
    get = Call("GET", "/things/1", _api.reads(Thing))
    flow = _api.wait_until(get, lambda t: False, lambda t: TimeoutError(), 25.0, 10.0)
    with pytest.raises(ConnectionLost):
        drive(flow, answering(answers, clock))
    assert clock[0] == 25.0  # the last sleep was cut to the deadline, and the failure there raised


def test_wait_until_raises_what_timed_out_makes_and_passes_other_errors_on() -> None:
    get = Call("GET", "/things/1", _api.reads(Thing))
    never = _api.wait_until(get, lambda t: False, lambda t: TimeoutError(t.status), 0.0, 1.0)
    with pytest.raises(TimeoutError, match="running"):
        drive(never, lambda step: Thing(status="running"))

    def missing(step: Step) -> Any:
        raise NotFound(404, "not_found", "no such thing")

    with pytest.raises(NotFound):
        drive(_api.wait_until(get, lambda t: True, lambda t: TimeoutError(), None, 1.0), missing)


def test_jobs_wait_times_out_with_the_last_job() -> None:
    class Job(pydantic.BaseModel):
        id: str
        status: str

    flow = _api.wait_job("job_1", 0.0, 1.0)
    with pytest.raises(WaitTimeout) as timed_out:
        drive(flow, lambda step: Job(id="job_1", status="running"))
    assert timed_out.value.job_id == "job_1"


def test_log_lines_joins_lines_cut_between_chunks_and_ends_with_the_unfinished_one() -> None:
    chunks = ["step 1\nst", "ep 2\n", "", "no newline"]
    offsets = [0, 10, 15, 15]

    def answer(step: Step) -> LogChunk:
        text, offset = chunks.pop(0), offsets.pop(0)
        return LogChunk(offset=offset, next_offset=offset + len(text), text=text, complete=not chunks)

    items, _, _ = drive(_api.log_lines(_api.log_chunks("job_1", 0, False, 1.0)), answer)
    assert items == ["step 1", "step 2"]  # an empty chunk of an unfinished job: what is there was read

    chunks[:], offsets[:] = ["a\nb"], [0]
    items, _, _ = drive(_api.log_lines(_api.log_chunks("job_1", 0, False, 1.0)), answer)
    assert items == ["a", "b"]


def test_a_followed_log_catches_up_by_a_plain_read_when_its_stream_breaks() -> None:
    lines = iter(["event: log", 'data: {"offset": 0, "next_offset": 7, "text": "step 1\\n"}', ""])
    read_at: list[int] = []

    def answer(step: Step) -> Any:
        if isinstance(step, Open):
            return None
        if isinstance(step, Next):
            line = next(lines, None)
            if line is None:
                raise ConnectionLost("http://x", "peer closed", "/jobs/job_1/logs/stream")
            return line
        if isinstance(step, Call):
            read_at.append(step.params["offset"])
            return LogChunk(offset=7, next_offset=14, text="step 2\n", complete=True)
        return None  # Sleep

    items, _, steps = drive(_api.log_chunks("job_1", 0, True, 0.25), answer)
    assert [c.text for c in items] == ["step 1\n", "step 2\n"] and items[-1].complete
    assert read_at == [7]  # from where the stream stopped
    assert Sleep(0.25) in steps


def test_a_followed_log_rides_out_a_server_restart_and_reads_on_from_where_it_was() -> None:
    # The stream drops, the server refuses the reopened stream and the first catch-up read while it
    # restarts, then answers: the follow goes on from the offset it had, with nothing read twice.
    lines = iter(["event: log", 'data: {"offset": 0, "next_offset": 7, "text": "step 1\\n"}', ""])
    opens: list[Any] = [None, ConnectionFailed(URL, "connection refused")]
    reads: list[Any] = [
        LogChunk(offset=7, next_offset=7, text="", complete=False),  # caught up: the stream reopens
        ConnectionFailed(URL, "connection refused"),
        LogChunk(offset=7, next_offset=14, text="step 2\n", complete=True),
    ]
    read_at: list[int] = []

    def answer(step: Step) -> Any:
        if isinstance(step, Open):
            got = opens.pop(0)
        elif isinstance(step, Next):
            got = next(lines, ConnectionLost(URL, "peer closed"))
        elif isinstance(step, Call):
            read_at.append(step.params["offset"])
            got = reads.pop(0)
        else:
            return None  # Sleep
        if isinstance(got, Exception):
            raise got
        return got

    items, _, _ = drive(_api.log_chunks("job_1", 0, True, 0.25), answer)
    assert [c.text for c in items] == ["step 1\n", "step 2\n"] and items[-1].complete
    assert read_at == [7, 7, 7] and opens == [] and reads == []


def test_a_followed_log_of_a_server_never_reached_fails_at_once() -> None:
    def refused(step: Step) -> Any:
        raise ConnectionFailed(URL, "connection refused")

    with pytest.raises(ConnectionFailed):
        drive(_api.log_chunks("job_1", 0, True, 0.25), refused)
