"""Idempotency-Key (IETF httpapi-idempotency-key-header) on real `ftq api` processes.

Two API processes share one fresh PostgreSQL database (created and dropped here) and race the same
key from many threads: exactly one job exists afterwards, every answer is that job (201) or "in
progress" (409). Keys belong to their owner, a key reused with another body is a 422, and a key
expires after FTQ_IDEMPOTENCY_TTL_HOURS.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.e2e.security.common import LIMIT_TOKENS, LIMITS, ServerFactory, base_spec
from tests.harness import Deployment, postgres

ALICE, BOB = "idem-alice-token", "idem-bob-token"
TTL_HOURS = LIMITS["ttl_hours"]  # 3.6 s


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with postgres.database("ftq_sec") as url:
        yield url


@pytest.fixture(scope="module")
def replicas(server_factory: ServerFactory, assets: Path, pg_url: str) -> list[Deployment]:
    """Two API processes on the same store, as behind a load balancer."""
    common = {
        "api_tokens": f"{ALICE}:alice,{BOB}:bob",
        "local_roots": str(assets),
        "database_url": pg_url,
        "post_rate_per_minute": "100000",
    }
    # Started side by side: a start-up is mostly imports, and there are two cores.
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: server_factory(**common), range(2))
    return [first, second]


def _count_jobs(pg_url: str, owner: str) -> int:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT count(*) FROM jobs WHERE owner = %s", (owner,)).fetchone()
    assert row is not None
    return int(row[0])


def test_concurrent_duplicates_across_replicas_make_one_job(replicas: list[Deployment], pg_url: str) -> None:
    key = "race-" + secrets.token_hex(4)
    spec = base_spec()
    spec["name"] = "race"
    n = 12
    barrier = threading.Barrier(n)
    results: list[tuple[int, dict[str, Any], dict[str, str]]] = []
    lock = threading.Lock()

    def post(i: int) -> None:
        server = replicas[i % 2]
        with httpx.Client(base_url=server.url, timeout=60) as c:
            barrier.wait()
            headers = {"Authorization": f"Bearer {ALICE}", "Idempotency-Key": key}
            r = c.post("/jobs", json=spec, headers=headers)
            with lock:
                results.append((r.status_code, r.json(), dict(r.headers)))

    threads = [threading.Thread(target=post, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    codes = [code for code, _, _ in results]
    assert set(codes) <= {201, 409}, results
    assert 201 in codes, codes
    print(f"idempotency race: {sorted(codes)}")
    ids = {body["id"] for code, body, _ in results if code == 201}
    assert len(ids) == 1, ids
    for code, body, _ in results:
        if code == 409:
            assert body["code"] == "conflict"
    assert _count_jobs(pg_url, "alice") == 1
    # A retry after the race is answered with the same job, marked as a replay, by either replica.
    for server in replicas:
        with server.client(ALICE) as c:
            r = c.post("/jobs", json=spec, headers={"Idempotency-Key": key})
            assert r.status_code == 201 and r.json()["id"] in ids, r.text
            assert r.headers.get("Idempotent-Replayed") == "true"
    assert _count_jobs(pg_url, "alice") == 1


def test_same_key_other_body_is_422_and_keys_are_per_owner(replicas: list[Deployment], pg_url: str) -> None:
    key = "k-" + secrets.token_hex(4)
    a, b = replicas
    with a.client(ALICE) as alice_a, b.client(ALICE) as alice_b, b.client(BOB) as bob:
        first = alice_a.post("/jobs", json=base_spec(), headers={"Idempotency-Key": key})
        assert first.status_code == 201, first.text
        other = base_spec()
        other["training"]["max_steps"] = 3
        r = alice_b.post("/jobs", json=other, headers={"Idempotency-Key": key})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
        # The same key from bob is bob's own: a new job, his.
        r = bob.post("/jobs", json=base_spec(), headers={"Idempotency-Key": key})
        assert r.status_code == 201 and r.json()["owner"] == "bob" and r.json()["id"] != first.json()["id"]
        assert "Idempotent-Replayed" not in r.headers
        # Bob cannot reach alice's job through her key either.
        assert bob.get(f"/jobs/{first.json()['id']}").status_code == 404


def test_keys_expire(limited: Deployment) -> None:
    key = "ttl-" + secrets.token_hex(4)
    with limited.client(LIMIT_TOKENS["ttl"]) as c:
        t0 = time.monotonic()
        first = c.post("/jobs", json=base_spec(), headers={"Idempotency-Key": key})
        again = c.post("/jobs", json=base_spec(), headers={"Idempotency-Key": key})
        assert first.status_code == 201 and again.status_code == 201
        if time.monotonic() - t0 < TTL_HOURS * 3600 * 0.9:
            assert again.json()["id"] == first.json()["id"]
        time.sleep(max(0.0, TTL_HOURS * 3600 + 0.5 - (time.monotonic() - t0)))
        later = c.post("/jobs", json=base_spec(), headers={"Idempotency-Key": key})
        assert later.status_code == 201, later.text
        assert later.json()["id"] != first.json()["id"]
        assert "Idempotent-Replayed" not in later.headers
        # ... and the key now names the new job (while it lives); another body is refused again.
        t1 = time.monotonic()
        replay = c.post("/jobs", json=base_spec(), headers={"Idempotency-Key": key})
        other = base_spec()
        other["training"]["max_steps"] = 5
        refused = c.post("/jobs", json=other, headers={"Idempotency-Key": key})
        if time.monotonic() - t1 < TTL_HOURS * 3600 * 0.9:
            assert replay.json()["id"] == later.json()["id"]
            assert refused.status_code == 422, refused.text
