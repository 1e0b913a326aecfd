"""A small in-process cache of metrics-poll bodies.

Every open dashboard repeats the same incremental poll every few seconds. A finished job's points never
change again (ingest completes before a job turns terminal), so its pages are kept until evicted; a
running job's pages are kept for a fraction of the ingest interval, so a point still reaches the API
within the ingest interval plus `RUNNING_TTL_SECONDS`. Keys include the owner: a hit is only served to
the owner whose request filled it.
"""

from __future__ import annotations

from ftq.runtime.lru import LRU

RUNNING_TTL_SECONDS = 0.5
MAX_BYTES = 64 * 1024 * 1024
MAX_PAGES = 65_536

Key = tuple[str, str, int, int]  # owner, job id, after_step, limit


class PollCache:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self._pages: LRU[Key, bytes] = LRU(MAX_PAGES, max_cost=max_bytes, cost=len)

    def get(self, key: Key) -> bytes | None:
        return self._pages.get(key)

    def put(self, key: Key, body: bytes, *, final: bool) -> None:
        self._pages.put(key, body, ttl=None if final else RUNNING_TTL_SECONDS)
