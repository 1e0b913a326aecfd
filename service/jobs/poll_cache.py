"""A small in-process cache of metrics-poll bodies.

Every open dashboard repeats the same incremental poll every few seconds. A finished job's points never
change again (ingest completes before a job turns terminal), so its pages are kept until evicted; a
running job's pages are kept for a fraction of the ingest interval, so a point still reaches the API
within the ingest interval plus `RUNNING_TTL_SECONDS`. Keys include the owner: a hit is only served to
the owner whose request filled it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

RUNNING_TTL_SECONDS = 0.5
MAX_BYTES = 64 * 1024 * 1024

Key = tuple[str, str, int, int]  # owner, job id, after_step, limit


class PollCache:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self._entries: OrderedDict[Key, tuple[float, bytes]] = OrderedDict()
        self._bytes = 0
        self._max = max_bytes
        self._lock = threading.Lock()

    def get(self, key: Key) -> bytes | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            expires, body = hit
            if expires < time.monotonic():
                self._drop(key)
                return None
            self._entries.move_to_end(key)
            return body

    def put(self, key: Key, body: bytes, *, final: bool) -> None:
        if len(body) > self._max // 8:
            return
        expires = float("inf") if final else time.monotonic() + RUNNING_TTL_SECONDS
        with self._lock:
            if key in self._entries:
                self._drop(key)
            self._entries[key] = (expires, body)
            self._bytes += len(body)
            while self._bytes > self._max and self._entries:
                self._drop(next(iter(self._entries)))

    def _drop(self, key: Key) -> None:
        _, body = self._entries.pop(key)
        self._bytes -= len(body)
