"""What a job is doing before its first step and after its last: the progress phase and a line a person
reads ("starting 2 processes", "loading the model"), from the job's status and the markers the trainer
writes to train.log on its way (its own log lines, read back; nothing extra is logged for this).

Only starting and running jobs without a step yet, or at their last one, have their log looked at, and
then only its first and last bytes: a list of a hundred jobs costs no more than a few small reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ftq.contract import runs
from ftq.contract.status import JobStatus
from ftq.runtime import userfiles
from ftq.store.models import Job

# What the log's ends hold: the markers come early (head) or late (tail), never in a long middle.
_READ = 16 * 1024


@dataclass(frozen=True)
class Phase:
    phase: str | None
    message: str | None


# The fetch step's lines (trainer/fetch.py), before any rank starts: the last one says how far it got.
_FETCHING = re.compile(r"\bfetching (\S+): (\d+) of (\d+) bytes")

# The trainer's lines, in the order a run writes them (trainer/train.py): the last one present says where
# the run is.
_MARKERS: list[tuple[re.Pattern[str], str, str]] = [
    (
        re.compile(r"\bstrategy \S+ \(.*\), \d+ process\(es\)"),
        "loading",
        "loading the tokenizer, dataset and model",
    ),
    (
        re.compile(r"\bmodel .+: attention \S+, dtype "),
        "loading",
        "preparing the trainer (tokenizing the dataset)",
    ),
    (re.compile(r"\bresuming from \S"), "loading", "resuming from the checkpoint"),
    (re.compile(r"\btrained to step \d+"), "saving", "saving the final model"),
]


def phase_of(job: Job, spec_world_size: int, runs_dir: Path | None) -> Phase:
    status = JobStatus(job.status)
    if status == JobStatus.queued:
        return Phase("queued", None)
    if status == JobStatus.cancelling:
        return Phase("cancelling", "stopping the run")
    if status == JobStatus.paused:
        return Phase("paused", "paused; a resume continues from its newest checkpoint")
    if job.pause_requested_at is not None and status in (JobStatus.starting, JobStatus.running):
        return Phase("pausing", "saving a checkpoint and stopping the run")
    if status not in (JobStatus.starting, JobStatus.running):
        return Phase(None, None)
    step, max_steps = job.progress_step, job.progress_max_steps
    training = Phase("training", None)
    if step is not None and (max_steps is None or step < max_steps):
        return training
    starting = Phase("starting", f"starting {spec_world_size} process{'es' if spec_world_size != 1 else ''}")
    if runs_dir is None:
        return training if step is not None else starting
    found = _last_marker(runs.run_dir(runs_dir, job.id) / runs.TRAIN_LOG)
    if found is None:
        return training if step is not None else starting
    if found.phase == "loading" and step is not None:
        return training
    return found


def _last_marker(log: Path) -> Phase | None:
    try:
        head, tail, _ = userfiles.read_ends(log, _READ)
    except userfiles.NotReadable:
        return None
    text = (head + b"\n" + tail).decode("utf-8", "replace")
    found = None
    if fetched := _FETCHING.findall(text):
        repo, done, total = fetched[-1]
        found = Phase("fetching", f"fetching {repo}: {_size(int(done))} of {_size(int(total))}")
    for pattern, phase, message in _MARKERS:
        if pattern.search(text):
            found = Phase(phase, message)
    return found


def _size(n: int) -> str:
    """Bytes as a person reads them: 512 bytes, 1.5 MiB, 16.1 GiB."""
    if n < 1024:
        return f"{n} bytes"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
