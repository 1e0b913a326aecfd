"""The thread-pool hop of the read routes polled all the time (job, list, logs, metrics, samples).

Each does all its work in one hop on a read session that is returned before the hop ends. A session held
as a sync dependency would keep its pooled connection while the request queues for a thread for its next
step, so enough pollers would hold every connection while the threads wait for one (and stall for the
pool's 30 s timeout).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio

T = TypeVar("T")

# At most this many read hops at once, below the engine's pool of 20: FastAPI's thread pool has 40
# threads, and each connection past the pool would be opened and closed per request (a PostgreSQL
# connect inside every metrics poll). One core gains nothing from more.
_READ_SLOTS = anyio.CapacityLimiter(16)


async def in_thread(fn: Callable[[], T]) -> T:
    """fn() in a worker thread, at most 16 at once."""
    return await anyio.to_thread.run_sync(fn, limiter=_READ_SLOTS)
