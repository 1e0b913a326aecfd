"""Issue 18 item 4 against a real `ftq api` on PostgreSQL: open log streams hold no database connection.

One owner opens as many streams as it may on a queued job (60 here): the next is a 429, no session is
left open in the database while they stream, another owner's `GET /jobs` stays fast, the streams send
heartbeats while nothing happens, a stream the client closes frees its place, and every stream ends
when the job ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.e2e.security.common import base_spec
from tests.harness import Deployment, config_only_model, text_dataset, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

CAP = 60
HEARTBEAT_S = 1.0
TOKENS = {"streamer": "stream-token-01", "other": "stream-token-02"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("streams")
    config_only_model(root / "data" / "model")
    text_dataset(root / "data" / "data" / "train.jsonl")
    with Deployment(
        root,
        mode="api",
        store="postgres",
        tokens=TOKENS,
        settings={"max_log_streams_per_owner": CAP, "log_stream_heartbeat_seconds": HEARTBEAT_S},
    ) as dep:
        yield dep


def _db_sessions_in_transaction(database_url: str) -> int:
    """Connections to this database that hold a transaction open (a session not yet returned)."""
    url = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"
        ).fetchone()
    return int(row[0]) if row else 0


async def _open(client: httpx.AsyncClient, job_id: str) -> httpx.Response:
    req = client.build_request("GET", f"/jobs/{job_id}/logs/stream")
    return await client.send(req, stream=True)


_readers: dict[int, AsyncIterator[str]] = {}


async def _until(resp: httpx.Response, marker: str, timeout: float) -> bool:
    """Whether `marker` shows up in the stream before `timeout` seconds (or before it closes)."""
    # One text iterator per response: a stream is read on from where the last call stopped.
    reader = _readers.setdefault(id(resp), resp.aiter_text())

    async def read() -> bool:
        tail = ""
        async for text in reader:
            # The tail of the previous piece too: a marker may arrive split in two.
            tail = tail[-len(marker) :] + text
            if marker in tail:
                return True
        return False

    try:
        return await asyncio.wait_for(read(), timeout)
    except TimeoutError:
        return False


def _get_jobs_latency(client: httpx.Client, n: int = 10) -> float:
    worst = 0.0
    for _ in range(n):
        t0 = time.monotonic()
        r = client.get("/jobs")
        worst = max(worst, time.monotonic() - t0)
        assert r.status_code == 200, r.text
    return worst


def test_open_streams_hold_no_connection_and_end_with_the_job(server: Deployment, tmp_path: Path) -> None:
    assert server.database_url is not None
    with server.client(TOKENS["streamer"]) as owner, server.client(TOKENS["other"]) as other:
        created = owner.post("/jobs", json=base_spec())
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]  # no worker: it stays queued
        assert other.post("/jobs", json=base_spec()).status_code == 201
        baseline = _get_jobs_latency(other)

        async def scenario() -> None:
            limits = httpx.Limits(max_connections=CAP + 10, max_keepalive_connections=0)
            headers = {"Authorization": f"Bearer {TOKENS['streamer']}"}
            async with httpx.AsyncClient(
                base_url=server.url, headers=headers, timeout=60, limits=limits
            ) as streams:
                opened = await asyncio.gather(*(_open(streams, job_id) for _ in range(CAP)))
                try:
                    assert [r.status_code for r in opened] == [200] * CAP
                    # One more from the same owner is refused, with the setting named.
                    extra = await _open(streams, job_id)
                    await extra.aread()
                    assert extra.status_code == 429, extra.text
                    assert "FTQ_MAX_LOG_STREAMS_PER_OWNER" in extra.json()["detail"]
                    assert int(extra.headers["Retry-After"]) > 0

                    # Nothing holds a database session while the streams wait for the job.
                    held = await asyncio.to_thread(_db_sessions_in_transaction, server.database_url or "")
                    assert held == 0, f"{held} sessions held open by {CAP} streams"
                    # Another owner is served as fast as ever (a generous bound: a pool starved by the
                    # streams made it wait for the pool's 30 s timeout).
                    worst = await asyncio.to_thread(_get_jobs_latency, other)
                    assert worst < max(2.0, 20 * baseline), (worst, baseline)

                    # A quiet stream sends heartbeats.
                    assert await _until(opened[0], ": ping", timeout=HEARTBEAT_S * 10)

                    # A stream the client closes gives its place back.
                    await opened.pop().aclose()
                    again: list[httpx.Response] = []

                    async def reopened() -> bool:
                        r = await _open(streams, job_id)
                        if r.status_code == 200:
                            again.append(r)
                            return True
                        await r.aclose()
                        return False

                    t0 = time.monotonic()
                    while not await reopened():
                        assert time.monotonic() - t0 < 15, "a closed stream's place was never given back"
                        await asyncio.sleep(0.3)
                    opened.extend(again)

                    # Every stream ends once the job ends (here: cancelled while queued).
                    cancel = await streams.post(f"/jobs/{job_id}/cancel")
                    assert cancel.status_code == 202, cancel.text
                    ended = await asyncio.gather(*(_until(r, "event: end", timeout=30) for r in opened))
                    assert all(ended), f"{ended.count(False)} streams did not end with the job"
                finally:
                    for r in opened:
                        with contextlib.suppress(Exception):
                            await r.aclose()

        asyncio.run(scenario())

        # Every place is free again once the streams ended: the owner may open the full count anew (a
        # slot kept by an ended stream would make one of these a 429).
        async def reopen_all() -> bool:
            async with httpx.AsyncClient(
                base_url=server.url,
                headers={"Authorization": f"Bearer {TOKENS['streamer']}"},
                timeout=30,
                limits=httpx.Limits(max_connections=CAP + 5),
            ) as c:
                rs = await asyncio.gather(*(_open(c, job_id) for _ in range(CAP)))
                for r in rs:
                    await r.aclose()
                return [r.status_code for r in rs] == [200] * CAP

        wait_until(
            "every stream's place given back", lambda: asyncio.run(reopen_all()), timeout=15, every=0.5
        )
