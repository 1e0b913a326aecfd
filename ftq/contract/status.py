"""A job's statuses and the transitions between them: the one definition every process uses."""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    queued = "queued"
    starting = "starting"
    running = "running"
    cancelling = "cancelling"
    # Held: a pause stopped its run with a checkpoint (or kept it from being placed); a resume queues it
    # again and its next run continues from that checkpoint. Not terminal, holds no devices.
    paused = "paused"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled})
ACTIVE = frozenset(
    {JobStatus.queued, JobStatus.starting, JobStatus.running, JobStatus.cancelling, JobStatus.paused}
)
# Launched or about to be: what a reconcile sweep looks at.
LAUNCHED = (JobStatus.starting, JobStatus.running, JobStatus.cancelling)

# Every compare-and-set in the store moves a job along one of these edges and no other. `starting` and
# `running` go back to `queued` when a claim was never launched or a preempted run is retried. A pause
# holds a queued job at once (`queued -> paused`); a launched one stays `starting`/`running` until its run
# has checkpointed and ended, then `-> paused`. A resume is `paused -> queued`; a paused job may be
# cancelled (at once: nothing runs).
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.queued: frozenset(
        {JobStatus.starting, JobStatus.paused, JobStatus.cancelled, JobStatus.failed}
    ),
    JobStatus.starting: frozenset(
        {JobStatus.running, JobStatus.queued, JobStatus.paused, JobStatus.cancelling, *TERMINAL}
    ),
    JobStatus.running: frozenset({JobStatus.queued, JobStatus.paused, JobStatus.cancelling, *TERMINAL}),
    JobStatus.cancelling: frozenset(TERMINAL),
    JobStatus.paused: frozenset({JobStatus.queued, JobStatus.cancelled}),
    JobStatus.succeeded: frozenset(),
    JobStatus.failed: frozenset(),
    JobStatus.cancelled: frozenset(),
}


def can_move(src: JobStatus | str, dst: JobStatus | str) -> bool:
    return JobStatus(dst) in TRANSITIONS[JobStatus(src)]


def sources_of(dst: JobStatus) -> list[JobStatus]:
    """The statuses a job may be in to move to `dst` (the WHERE of a compare-and-set)."""
    return [s for s, targets in TRANSITIONS.items() if dst in targets]


class FileStatus(StrEnum):
    """An uploaded file's validation: `validating` until the worker has read every line."""

    validating = "validating"
    ready = "ready"
    invalid = "invalid"
