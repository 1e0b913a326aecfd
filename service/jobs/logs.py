"""Reading a job's train.log in chunks for the API: whole UTF-8 characters, the run's secrets masked."""

from __future__ import annotations

from pathlib import Path

from ftq.contract import runs
from ftq.contract.schemas import LogChunk
from ftq.contract.status import TERMINAL, JobStatus
from ftq.runtime import redact
from ftq.runtime.settings import Settings
from ftq.store.models import Job

LOG_CHUNK_MAX = 1_048_576


def read_log(job: Job, settings: Settings, *, offset: int, limit: int, secrets_: list[str]) -> LogChunk:
    """Bytes [offset, offset+limit) of train.log, cut back to a whole UTF-8 character, secrets masked.

    A chunk holds at least one whole character when one is there, so a small `limit` still moves on.
    A secret is masked even when the chunk holds only part of it: the bytes around the chunk are read
    too, and every byte of the chunk that lies inside a secret becomes part of a `***`.
    """
    terminal = JobStatus(job.status) in TERMINAL
    return read_log_file(
        log_path(settings, job.id), terminal=terminal, offset=offset, limit=limit, secrets_=secrets_
    )


def log_path(settings: Settings, job_id: str) -> Path:
    return runs.run_dir(settings.runs_dir, job_id) / runs.TRAIN_LOG


def read_log_file(path: Path, *, terminal: bool, offset: int, limit: int, secrets_: list[str]) -> LogChunk:
    """read_log on the file alone: `terminal` says whether the job has ended (the log is then whole)."""
    limit = max(1, min(limit, LOG_CHUNK_MAX))
    needles = redact.needles(secrets_)
    pad = max((len(n) for n in needles), default=1) - 1
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            start = min(offset, size)
            before = max(0, start - pad)
            f.seek(before)
            # `pad` bytes either side find secrets across the chunk's edges; 3 more end a character.
            window = f.read(start - before + limit + 3 + pad)
    except FileNotFoundError:
        return LogChunk(offset=offset, next_offset=offset, text="", complete=terminal)
    at = start - before
    data = window[at : at + limit]
    # A live log may end inside a character that is still being written: leave it for the next read.
    if start + len(data) < size or not terminal:
        data = _trim_partial_utf8(data) or _first_char(window[at : at + 4])
    next_offset = start + len(data) if data else offset
    text = redact.mask(window, at, len(data), needles).decode("utf-8", errors="replace")
    return LogChunk(
        offset=offset, next_offset=next_offset, text=text, complete=terminal and next_offset >= size
    )


def _trim_partial_utf8(data: bytes) -> bytes:
    # Drop an incomplete multi-byte sequence at the end; the next poll starts on its first byte.
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if b & 0x80 == 0:  # ASCII
            return data
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4
        return data if back >= need else data[:-back]
    return data


def _first_char(data: bytes) -> bytes:
    """The first UTF-8 character of data when it is all there, else b""."""
    if not data:
        return b""
    b = data[0]
    need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
    return data[:need] if len(data) >= need else b""
