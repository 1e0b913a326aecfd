"""progress.jsonl: what a run is doing, as records the trainer writes and the service reads.

The fetch step (trainer/fetch.py) and the trainer (trainer/train.py) append one `ProgressRecord` per line
to `runs.PROGRESS` in the run directory each time the run moves on before its first step and after its
last one: the bytes of each fetched file, loading, resuming, saving the final model. Only one process
writes (the fetch step, or the trainer's rank 0), each line in one write and flushed, so a reader sees
whole lines and at most a torn last one. The service shows the newest record as the job's
`progress.phase` and `progress.message` (service/jobs/phase.py); the steps themselves stay metric points
(metrics.jsonl), ingested into the job's `progress.step`.

The words a person reads (`message`) are made here, so the trainer and the service agree on them without
either parsing the other's log lines. train.log still says the same things, for people only.
"""

from __future__ import annotations

import json
import os
import time
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from ftq.contract import runs

# A message longer than this is cut by the reader: the run writes the file, so its length is the run's.
MESSAGE_LIMIT = 240
# How much of the file's end the reader looks at for the newest whole record (a record is ~200 bytes).
TAIL_BYTES = 4096


class RunPhase(StrEnum):
    """What the run says it is doing before its first step and after its last; `progress.phase` adds
    what the service knows without the run: queued, starting, training (from the steps ingested out of
    metrics.jsonl), cancelling, pausing, paused."""

    fetching = "fetching"  # the fetch step downloads hub models and datasets, before any rank starts
    loading = "loading"  # tokenizer, dataset, model, the TRL trainer; a resumed checkpoint
    saving = "saving"  # the final model (and the last evaluation before it)


class ProgressRecord(BaseModel):
    """One line of progress.jsonl."""

    time: float = Field(description="When the run wrote it (Unix seconds).")
    phase: RunPhase
    message: str | None = Field(None, description="The phase in words, as `progress.message` shows it.")
    step: int | None = Field(None, description="The optimizer step reached, where the run knows it.")
    max_steps: int | None = None
    epoch: float | None = None
    eta_seconds: float | None = None
    # The fetch step's: the repo being fetched, and its bytes done of all it fetches.
    repo: str | None = None
    done_bytes: int | None = None
    total_bytes: int | None = None


# The loading and saving records' words, in the order a run writes them.
LOADING_INPUTS = "loading the tokenizer, dataset and model"
PREPARING_TRAINER = "preparing the trainer (tokenizing the dataset)"
RESUMING = "resuming from the checkpoint"
SAVING_FINAL = "saving the final model"


def fetching(repo: str, done: int, total: int) -> ProgressRecord:
    """The fetch step's record after each file: `fetching owner/model: 4.6 GiB of 15.0 GiB`."""
    return ProgressRecord(
        time=time.time(),
        phase=RunPhase.fetching,
        message=f"fetching {repo}: {human_size(done)} of {human_size(total)}",
        repo=repo,
        done_bytes=done,
        total_bytes=total,
    )


def record(
    phase: RunPhase, message: str | None, *, step: int | None = None, max_steps: int | None = None
) -> ProgressRecord:
    return ProgressRecord(time=time.time(), phase=phase, message=message, step=step, max_steps=max_steps)


def append(path: Path, rec: ProgressRecord) -> None:
    """One record as one line, written in one `write` to a file opened for appending, then flushed."""
    line = rec.model_dump_json(exclude_none=True) + "\n"
    with path.open("a", encoding="utf-8") as f:
        f.write(line)
        f.flush()


def parse(line: bytes | str) -> ProgressRecord | None:
    """A line as a record, or None where it is not one (the run writes the file: anything may be in it)."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    try:
        rec = ProgressRecord.model_validate(obj)
    except ValidationError:
        return None
    if rec.message is not None and len(rec.message) > MESSAGE_LIMIT:
        rec = rec.model_copy(update={"message": rec.message[:MESSAGE_LIMIT]})
    return rec


def latest(path: Path) -> ProgressRecord | None:
    """The newest whole record of a progress.jsonl; None where there is none yet, or the path is not a
    regular file (a symlink or a FIFO the run put there is read as nothing, never followed or waited on).
    Reads only the file's last TAIL_BYTES."""
    try:
        fd, size = runs.open_regular(path)
    except OSError:
        return None
    try:
        data = os.pread(fd, TAIL_BYTES, max(0, size - TAIL_BYTES))
    except OSError:
        return None
    finally:
        os.close(fd)
    end = data.rfind(b"\n")
    if end < 0:
        return None
    lines = data[:end].split(b"\n")
    if size > TAIL_BYTES:
        lines = lines[1:]  # the first line of the window may be cut at its start
    for line in reversed(lines):
        rec = parse(line)
        if rec is not None:
            return rec
    return None


def human_size(n: int) -> str:
    """Bytes as a person reads them: 512 bytes, 1.5 MiB, 16.1 GiB."""
    if n < 1024:
        return f"{n} bytes"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
