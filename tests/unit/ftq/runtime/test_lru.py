"""ftq.runtime.lru.LRU: least recently used first out, by count and by cost, expiry, and threads."""

from __future__ import annotations

import threading
import time

import pytest

from ftq.runtime.lru import LRU


def test_the_least_recently_used_goes_first() -> None:
    cache: LRU[str, int] = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)


def test_the_cost_bound_evicts_and_refuses_what_is_too_big() -> None:
    cache: LRU[str, bytes] = LRU(100, max_cost=80, cost=len)
    cache.put("big", b"x" * 11)  # over 80 // 8: not kept
    assert cache.get("big") is None and cache.total_cost == 0
    for i in range(9):
        cache.put(str(i), b"y" * 10)
    assert cache.total_cost == 80 and cache.get("0") is None and cache.get("8") == b"y" * 10
    cache.put("8", b"z" * 5)  # replacing an entry gives back its cost
    assert cache.total_cost == 75


def test_an_entry_expires_after_its_ttl() -> None:
    cache: LRU[str, int] = LRU(4)
    cache.put("short", 1, ttl=0.05)
    cache.put("kept", 2)
    assert cache.get("short") == 1
    time.sleep(0.08)
    assert cache.get("short") is None and cache.get("kept") == 2 and len(cache) == 1


def test_threads_keep_the_bounds() -> None:
    cache: LRU[int, bytes] = LRU(50, max_cost=4000, cost=len)

    def fill(base: int) -> None:
        for i in range(500):
            cache.put(base + i, b"q" * 20)
            cache.get(base + i // 2)

    threads = [threading.Thread(target=fill, args=(n * 1000,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(cache) <= 50 and cache.total_cost == 20 * len(cache)


def test_a_cost_needs_its_bound() -> None:
    with pytest.raises(ValueError):
        LRU(1, cost=len)
