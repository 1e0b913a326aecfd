"""Following a job's train.log as server-sent events (`GET /jobs/{id}/logs/stream`).

No session lives as long as a stream: a client may keep one open for days, and 40 of them held every
pooled connection. The job's status is read in short sessions, the log from the file; each owner has at
most FTQ_MAX_LOG_STREAMS_PER_OWNER streams open in an API process.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from fastapi.responses import StreamingResponse

from ftq.contract.schemas import LogChunk
from ftq.contract.status import TERMINAL, JobStatus
from ftq.runtime.settings import Settings
from ftq.store.db import read_session
from ftq.store.repository import JobRepository
from service.errors import NotFound, TooManyRequests
from service.jobs import logs
from service.jobs.reads import in_thread
from service.routes import ClosingStream

# A stream looks at the log file this often (a stat on the event loop; a thread hop only when it grew) and
# at the job's status this often (one short read session, returned at once).
POLL_SECONDS = 0.5
STATUS_SECONDS = 2.0
CHUNK_BYTES = 65536
END_EVENT = b"event: end\ndata: {}\n\n"
PING = b": ping\n\n"


class StreamSlots:
    """Open log streams per owner (in this API process). Each holds a connection and a poll loop for as
    long as the client keeps it, so one owner's open tabs and scripts are bounded."""

    def __init__(self) -> None:
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()

    def acquire(self, owner: str, cap: int) -> None:
        with self._lock:
            if self._open[owner] >= cap:
                raise TooManyRequests(
                    f"{owner} already follows {cap} log streams (FTQ_MAX_LOG_STREAMS_PER_OWNER={cap}); "
                    "close one, or read GET /jobs/{id}/logs by offset",
                    retry_after=5,
                )
            self._open[owner] += 1

    def release(self, owner: str) -> None:
        with self._lock:
            self._open[owner] -= 1
            if self._open[owner] <= 0:
                del self._open[owner]


_slots = StreamSlots()


async def follow(owner: str, job_id: str, offset: int, settings: Settings) -> StreamingResponse:
    """The response that follows the job's log from `offset` until the job has ended and its log is
    read; 404 when the owner cannot read the job, 429 when the owner has all its streams open."""
    status_of = functools.partial(_status, owner, job_id)
    status = await in_thread(status_of)
    if status is None:
        raise NotFound(f"job {job_id} not found")
    _slots.acquire(owner, settings.max_log_streams_per_owner)
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            _slots.release(owner)

    try:
        events = _events(
            status_of,
            logs.log_path(settings, job_id),
            status,
            offset,
            secrets_=settings.secret_values(),
            heartbeat=settings.log_stream_heartbeat_seconds,
        )
        headers = {"Cache-Control": "no-cache"}
        # The owner's slot comes back however the stream ends.
        return ClosingStream(events, release, media_type="text/event-stream", headers=headers)
    except BaseException:
        release()
        raise


def _status(owner: str, job_id: str) -> JobStatus | None:
    with read_session() as session:
        job = JobRepository(session, owner).get(job_id)
        return None if job is None else JobStatus(job.status)


def _file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _log_event(chunk: LogChunk) -> bytes:
    payload = json.dumps({"offset": chunk.offset, "next_offset": chunk.next_offset, "text": chunk.text})
    return f"id: {chunk.next_offset}\nevent: log\ndata: {payload}\n\n".encode()


async def _events(
    status_of: Callable[[], JobStatus | None],
    path: Path,
    status: JobStatus,
    offset: int,
    *,
    secrets_: list[str],
    heartbeat: float,
) -> AsyncIterator[bytes]:
    """`log` events as the file grows, a ping while nothing is new, `end` once the job has ended and
    its log is read (or nothing once the job is gone)."""
    loop = asyncio.get_running_loop()
    pos = offset
    terminal = status in TERMINAL
    checked = sent = loop.time()
    while True:
        if not terminal and loop.time() - checked >= STATUS_SECONDS:
            current = await in_thread(status_of)
            checked = loop.time()
            if current is None:
                return
            terminal = current in TERMINAL
        # The status before the file: whatever the run wrote before it ended is read below.
        if terminal or _file_size(path) > pos:
            read = functools.partial(
                logs.read_log_file, path, terminal=terminal, offset=pos, limit=CHUNK_BYTES, secrets_=secrets_
            )
            chunk = await in_thread(read)
            if chunk.text:
                yield _log_event(chunk)
                pos, sent = chunk.next_offset, loop.time()
            if chunk.complete or (terminal and not chunk.text):
                yield END_EVENT
                return
            if chunk.text:
                continue
        if loop.time() - sent >= heartbeat:
            # Proxies close idle connections, and a client learns the server is still there.
            yield PING
            sent = loop.time()
        await asyncio.sleep(POLL_SECONDS)
