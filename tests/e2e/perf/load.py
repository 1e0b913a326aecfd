"""The load the perf acceptance tests apply: 16 client threads, one endpoint at a time, in alternating
rounds against /healthz on the same server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx

THREADS = 16
PER_THREAD = 15
ROUNDS = 5


def hammer(
    base: str, paths: list[str], per_thread: int, headers: dict[str, str] | None = None
) -> tuple[float, list[str]]:
    """THREADS clients, each sending per_thread requests back to back; returns requests per second."""
    errors: list[str] = []
    clients = [httpx.Client(base_url=base, timeout=60, headers=headers) for _ in range(THREADS)]
    for c in clients:  # connect before the clock starts
        c.get("/healthz")
    go = threading.Barrier(THREADS + 1)

    def client(i: int) -> None:
        go.wait()
        for k in range(per_thread):
            r = clients[i].get(paths[(i + k) % len(paths)])
            if r.status_code != 200:
                errors.append(f"{r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    go.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    for c in clients:
        c.close()
    return THREADS * per_thread / elapsed, errors


def rounds_against_healthz(
    base: str, polls: Callable[[int], list[str]], headers: dict[str, str] | None = None
) -> tuple[list[float], list[str]]:
    """ROUNDS rounds of /healthz then the metrics poll (`polls(round)` gives that round's paths):
    each round's metrics/healthz throughput ratio, and every error seen."""
    hammer(base, ["/healthz"], 3, headers=headers)  # warm both paths (threads, statement caches)
    hammer(base, polls(0), 3, headers=headers)
    ratios: list[float] = []
    errors: list[str] = []
    for r in range(ROUNDS):
        health, e = hammer(base, ["/healthz"], PER_THREAD, headers=headers)
        errors += e
        metrics, e = hammer(base, polls(r), PER_THREAD, headers=headers)
        errors += e
        ratios.append(metrics / health)
        print(f"healthz {health:.0f} req/s, metrics poll {metrics:.0f} req/s, ratio {ratios[-1]:.2f}")
    return ratios, errors
