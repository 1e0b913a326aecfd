"""The store plumbing under the API on real PostgreSQL: the event-loop read pool the metrics poll uses,
checked against the thread path it replaces, through terminated connections and shutdown."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from tests.harness.inprocess import MakeClient

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.postgres

ALICE, BOB = "alice-db-token-0001", "bob-db-token-0002"


def _pool_backends(url: str, *, terminate: bool = False) -> int:
    """How many connections the read pool holds in this database (terminating them if asked)."""
    from ftq.store.db import READ_POOL_APPLICATION_NAME

    what = "pg_terminate_backend(pid)" if terminate else "pid"
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT {what} FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            (READ_POOL_APPLICATION_NAME,),
        ).fetchall()
    return len(rows)


def _job_with_points(client: TestClient, spec: dict[str, Any], token: str, n: int) -> str:
    from ftq.store import repository
    from ftq.store.db import session_scope

    job = client.post("/jobs", json=spec, headers={"Authorization": f"Bearer {token}"}).json()
    with session_scope() as s:
        repository.upsert_points(
            s, job["id"], [{"step": i, "loss": 5 - i / 100, "learning_rate": 1e-3} for i in range(1, n + 1)]
        )
    return str(job["id"])


def test_event_loop_poll_gives_the_thread_path_bytes(
    make_client: MakeClient, pg_url: str, tiny_job: dict[str, Any]
) -> None:
    threads = make_client(pg_url, api_tokens=f"{ALICE}:alice,{BOB}:bob")  # no lifespan: thread path
    job = _job_with_points(threads, tiny_job, ALICE, 30)
    queries = [
        (ALICE, f"/jobs/{job}/metrics"),
        (ALICE, f"/jobs/{job}/metrics?after_step=10&limit=5"),
        (ALICE, f"/jobs/{job}/metrics?after_step=30"),  # no new points: the status, no data
        (ALICE, "/jobs/job_doesnotexist00/metrics"),
        (BOB, f"/jobs/{job}/metrics?after_step=10"),  # another owner's job: as if it did not exist
    ]
    want = [threads.get(q, headers={"Authorization": f"Bearer {t}"}) for t, q in queries]
    assert [r.status_code for r in want] == [200, 200, 200, 404, 404]
    assert [p["step"] for p in want[1].json()["data"]] == [11, 12, 13, 14, 15]
    assert want[2].json()["data"] == [] and want[2].json()["next_after_step"] == 30

    from service.app import create_app

    with type(threads)(create_app()) as loop_client:
        assert loop_client.app.state.read_pool is not None  # type: ignore[attr-defined]
        got = [loop_client.get(q, headers={"Authorization": f"Bearer {t}"}) for t, q in queries]
        assert _pool_backends(pg_url) >= 1
    assert [(r.status_code, r.content) for r in got] == [(r.status_code, r.content) for r in want]
    assert _pool_backends(pg_url) == 0  # shutdown closed them


def test_read_pool_is_bounded_and_survives_terminated_connections(
    make_client: MakeClient, pg_url: str, tiny_job: dict[str, Any]
) -> None:
    from ftq.store.db import AsyncReadPool
    from service.app import create_app

    first = make_client(pg_url)
    job = _job_with_points(first, tiny_job, "", 50)
    paths = [f"/jobs/{job}/metrics?after_step={k}" for k in range(40)]  # distinct: no cache hits

    with type(first)(create_app()) as client:
        pool: AsyncReadPool = client.app.state.read_pool  # type: ignore[attr-defined]
        with ThreadPoolExecutor(16) as ex:
            codes = list(ex.map(lambda p: client.get(p).status_code, paths))
        assert codes == [200] * len(paths)
        assert 1 <= _pool_backends(pg_url) <= pool._size

        # The server dropped every pooled connection (as in a database restart): the next polls are
        # answered, on new connections, rather than failing on the dead ones.
        assert _pool_backends(pg_url, terminate=True) >= 1
        again = [client.get(f"/jobs/{job}/metrics?after_step={k}&limit=3") for k in range(5)]
        assert [r.status_code for r in again] == [200] * 5
        assert [p["step"] for p in again[0].json()["data"]] == [1, 2, 3]
        assert _pool_backends(pg_url) >= 1


def test_cancelled_polls_give_their_connections_back(pg_url: str) -> None:
    import asyncio

    from ftq.store.db import READ_POOL_APPLICATION_NAME, AsyncReadPool

    async def scenario() -> list[int]:
        pool = AsyncReadPool({"conninfo": pg_url, "application_name": READ_POOL_APPLICATION_NAME}, size=2)

        async def slow(conn: Any) -> None:
            await conn.execute("SELECT pg_sleep(30)")

        async def one(conn: Any) -> int:
            return int((await (await conn.execute("SELECT 1")).fetchone())[0])

        # Both connections taken by polls that are then cancelled mid-query (a client gone, shutdown).
        stuck = [asyncio.create_task(pool.run(slow)) for _ in range(2)]
        await asyncio.sleep(0.5)
        for t in stuck:
            t.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)
        # Were their slots lost, these would wait forever (the timeout turns that into a failure).
        answers = await asyncio.wait_for(asyncio.gather(*(pool.run(one) for _ in range(6))), timeout=20)
        await pool.close()
        return list(answers)

    assert asyncio.run(scenario()) == [1] * 6
    assert _pool_backends(pg_url) == 0
