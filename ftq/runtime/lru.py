"""The one in-process cache helper: a thread-safe least-recently-used map, bounded by its number of
entries and, where a cost is given, by the entries' total cost (bytes), each entry kept until it is
evicted or, given a time to live, until it expires. The API's caches (metrics poll pages, validated
specs, a /v1 job's merged events, dataset preflight samples) are each one of these."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """`max_items` entries at most; with `cost`, also at most `max_cost` in all (an entry costing more
    than `max_cost // 8` is not kept: it would evict most of the others)."""

    def __init__(
        self, max_items: int, *, max_cost: int | None = None, cost: Callable[[V], int] | None = None
    ) -> None:
        if (max_cost is None) != (cost is None):
            raise ValueError("max_cost and cost go together")
        self._max_items = max_items
        self._max_cost = max_cost
        self._cost = cost
        self._total = 0
        self._entries: OrderedDict[K, tuple[float, int, V]] = OrderedDict()  # expires, cost, value
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value, made the most recently used; None when absent or expired."""
        with self._lock:
            held = self._entries.get(key)
            if held is None:
                return None
            if held[0] < time.monotonic():
                self._drop(key)
                return None
            self._entries.move_to_end(key)
            return held[2]

    def put(self, key: K, value: V, *, ttl: float | None = None) -> None:
        """Keep `value` under `key` (replacing what was there), for `ttl` seconds or until evicted."""
        cost = self._cost(value) if self._cost is not None else 0
        if self._max_cost is not None and cost > self._max_cost // 8:
            return
        expires = float("inf") if ttl is None else time.monotonic() + ttl
        with self._lock:
            if key in self._entries:
                self._drop(key)
            self._entries[key] = (expires, cost, value)
            self._total += cost
            while self._entries and (
                len(self._entries) > self._max_items
                or (self._max_cost is not None and self._total > self._max_cost)
            ):
                self._drop(next(iter(self._entries)))

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def total_cost(self) -> int:
        return self._total

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._total = 0

    def _drop(self, key: K) -> None:
        _, cost, _ = self._entries.pop(key)
        self._total -= cost
