"""The metrics poll's short way (service.jobs.poll.MetricsPollPath): a plain poll is answered with the
route's bytes and headers without reaching the app; anything else reaches the app, whose route answers
it (and its 401, 404 or 422) as before."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from service.jobs.poll import MetricsPollPath, plain_poll
from tests.harness.inprocess import MakeClient

JOB = "job_0123456789abcdef"


@pytest.mark.parametrize(
    ("path", "query", "plain"),
    [
        (f"/jobs/{JOB}/metrics", b"", (JOB, -1, 1000)),
        (f"/jobs/{JOB}/metrics", b"after_step=1995", (JOB, 1995, 1000)),
        (f"/jobs/{JOB}/metrics", b"limit=10&after_step=-1", (JOB, -1, 10)),
        (f"/jobs/{JOB}/metrics", b"after_step=2147483647&limit=10000", (JOB, 2**31 - 1, 10000)),
        (f"/jobs/{JOB}/metrics", b"after_step=2147483648", None),  # out of range: the route's 422
        (f"/jobs/{JOB}/metrics", b"after_step=-2", None),
        (f"/jobs/{JOB}/metrics", b"limit=0", None),
        (f"/jobs/{JOB}/metrics", b"limit=10001", None),
        (f"/jobs/{JOB}/metrics", b"after_step=abc", None),
        (f"/jobs/{JOB}/metrics", b"after_step=05", None),  # not as a client writes it: the route decides
        (f"/jobs/{JOB}/metrics", b"after_step=%2B5", None),
        (f"/jobs/{JOB}/metrics", b"after_step=1&after_step=2", None),
        (f"/jobs/{JOB}/metrics", b"after_step", None),
        (f"/jobs/{JOB}/metrics", b"after_step=1&", None),
        (f"/jobs/{JOB}/metrics", b"after_step=1&x=2", None),
        (f"/jobs/{JOB}/metrics/", b"", None),
        (f"/jobs/{JOB}/plan", b"", None),
        ("/jobs//metrics", b"", None),
        ("/jobs/metrics", b"", None),
        ("/jobs/a/b/metrics", b"", None),
        (f"/jobs/{'j' * 65}/metrics", b"", None),
    ],
)
def test_a_plain_poll_is_told_apart(path: str, query: bytes, plain: tuple[str, int, int] | None) -> None:
    scope = {"type": "http", "method": "GET", "path": path, "query_string": query, "root_path": ""}
    assert plain_poll(scope) == plain


def test_only_get_and_no_root_path() -> None:
    scope = {"type": "http", "method": "HEAD", "path": f"/jobs/{JOB}/metrics", "query_string": b""}
    assert plain_poll(scope) is None
    assert plain_poll({**scope, "method": "GET", "root_path": "/api"}) is None


class _Inner:
    """The app behind the short way: records what reaches it and answers 418."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 418, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def _call(
    client: TestClient, query: bytes, *, job: str, token: str | None = None, **scope_extra: Any
) -> tuple[_Inner, list[Message]]:
    inner = _Inner()
    short_way = MetricsPollPath(inner)
    headers = [(b"host", b"testserver")]
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    scope = {
        "type": "http",
        "method": "GET",
        "path": f"/jobs/{job}/metrics",
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "app": client.app,
        **scope_extra,
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        sent.append(message)

    anyio.run(short_way, scope, receive, send)
    return inner, sent


ALICE = {"Authorization": "Bearer tok-a"}


@pytest.fixture
def alices_job(make_client: MakeClient, tiny_job: dict[str, Any]) -> tuple[TestClient, str]:
    """An API with two owners (tok-a: alice, tok-b: bob), and alice's job with points at steps 1..20."""
    from ftq.store import repository
    from ftq.store.db import session_scope

    client = make_client(api_tokens="tok-a:alice,tok-b:bob")
    job: str = client.post("/jobs", json=tiny_job, headers=ALICE).json()["id"]
    with session_scope() as s:
        repository.upsert_points(
            s, job, [{"step": i, "loss": 3 - i / 100, "learning_rate": 1e-4} for i in range(1, 21)]
        )
    return client, job


def test_a_plain_poll_gets_the_routes_answer_without_the_app(alices_job: tuple[TestClient, str]) -> None:
    client, job = alices_job
    inner, sent = _call(client, b"after_step=15&limit=3", job=job, token="tok-a")
    assert inner.paths == []
    # The same poll through the route (an unknown parameter is not plain; the route ignores it).
    routed = client.get(f"/jobs/{job}/metrics?after_step=15&limit=3&x=1", headers=ALICE)
    assert routed.status_code == sent[0]["status"] == 200
    assert sent[1]["body"] == routed.content
    assert [p["step"] for p in routed.json()["data"]] == [16, 17, 18]
    assert dict(sent[0]["headers"]) == {k.encode(): v.encode() for k, v in routed.headers.items()}


def test_what_is_not_a_plain_readable_poll_reaches_the_app(alices_job: tuple[TestClient, str]) -> None:
    client, job = alices_job
    for query, token, job_id in [
        (b"", None, job),  # no token: the route's 401
        (b"", "wrong", job),
        (b"", "tok-b", job),  # another owner's job: the route's 404
        (b"", "tok-a", "job_doesnotexist"),
        (b"limit=0", "tok-a", job),  # the route's 422
    ]:
        inner, _ = _call(client, query, job=job_id, token=token)
        assert inner.paths == [f"/jobs/{job_id}/metrics"], (query, token, job_id)
    # A request FastAPI's telemetry traces takes the route, so its span names the route.
    inner, _ = _call(client, b"", job=job, token="tok-a", **{"fastapi.telemetry": object()})
    assert inner.paths == [f"/jobs/{job}/metrics"]


def test_the_route_still_answers_what_the_short_way_leaves(alices_job: tuple[TestClient, str]) -> None:
    client, job = alices_job
    assert client.get(f"/jobs/{job}/metrics").status_code == 401
    assert client.get(f"/jobs/{job}/metrics", headers={"Authorization": "Bearer tok-b"}).status_code == 404
    r = client.get(f"/jobs/{job}/metrics?limit=0", headers=ALICE)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "limit"]
    # Written otherwise than plainly, the route reads it as it always has.
    assert client.get(f"/jobs/{job}/metrics?after_step=018", headers=ALICE).json()["data"][0]["step"] == 19
