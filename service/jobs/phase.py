"""What a job is doing before its first step and after its last: the progress phase and a line a person
reads ("starting 2 processes", "loading the tokenizer, dataset and model"), from the job's status and the
newest record the run wrote to progress.jsonl (ftq.contract.progress).

Only starting and running jobs without a step yet, or at their last one, have their records looked at,
and then only the file's last few KiB: a list of a hundred jobs costs no more than a few small reads.

A run started by a trainer from before progress.jsonl (still running across an upgrade) has no records:
for it alone, `_phase_from_old_log_wording` reads the phase from the wording of its train.log, as ftq
did then.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ftq.contract import progress, runs
from ftq.contract.status import JobStatus
from ftq.runtime import userfiles
from ftq.runtime.redact import redact
from ftq.store.models import Job


@dataclass(frozen=True)
class Phase:
    phase: str | None
    message: str | None


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
    found = run_phase(runs.run_dir(runs_dir, job.id))
    if found is None:
        return training if step is not None else starting
    if found.phase == "loading" and step is not None:
        return training
    return found


def run_phase(run_dir: Path) -> Phase | None:
    """What the run last said it is doing: its newest progress record, else (a run from before the
    records) the old reading of train.log's wording."""
    path = run_dir / runs.PROGRESS
    if not path.exists() and not path.is_symlink():
        return _phase_from_old_log_wording(run_dir / runs.TRAIN_LOG)
    rec = progress.latest(path)
    if rec is None:
        return None
    # The run wrote the message: shown with the operator's secrets masked, as all a run writes.
    return Phase(str(rec.phase), redact(rec.message) if rec.message else None)


# For runs without progress.jsonl only: the markers their train.log held, read by its wording. ---------------
# A trainer from before the records wrote these lines (trainer/fetch.py, trainer/train.py). Today's writes
# each record before the line that says the same, so a run whose log holds one has progress.jsonl and is
# never read here. To be removed once no run from before can still be running.

# What the log's ends hold: the markers come early (head) or late (tail), never in a long middle.
_READ = 16 * 1024
# The fetch step's lines, before any rank starts: the last one says how far it got.
_FETCHING = re.compile(r"\bfetching (\S+): (\d+) of (\d+) bytes")
# The trainer's lines, in the order a run writes them: the last one present says where the run is.
_MARKERS: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"\bstrategy \S+ \(.*\), \d+ process\(es\)"), "loading", progress.LOADING_INPUTS),
    (re.compile(r"\bmodel .+: attention \S+, dtype "), "loading", progress.PREPARING_TRAINER),
    (re.compile(r"\bresuming from \S"), "loading", progress.RESUMING),
    (re.compile(r"\btrained to step \d+"), "saving", progress.SAVING_FINAL),
]


def _phase_from_old_log_wording(log: Path) -> Phase | None:
    try:
        head, tail, _ = userfiles.read_ends(log, _READ)
    except userfiles.NotReadable:
        return None
    text = (head + b"\n" + tail).decode("utf-8", "replace")
    found = None
    if fetched := _FETCHING.findall(text):
        repo, done, total = fetched[-1]
        found = Phase("fetching", progress.fetching(repo, int(done), int(total)).message)
    for pattern, phase, message in _MARKERS:
        if pattern.search(text):
            found = Phase(phase, message)
    return found
