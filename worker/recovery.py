"""What happens after a run fails: why it failed, whether it goes round again, and from where.

The controller (`worker.controller`) asks two questions when a run ends badly: `why_it_failed` (an error
code and a message a user can act on) and `retry` (is this a failure that says nothing about the job
itself, and does the operator's policy allow another attempt?). A retried job is queued again and its
next launch resumes from the run's newest checkpoint (`plan_for_attempt`).

A job with `resources.slurm.requeue_on_timeout` that reached its time limit (it checkpointed on SLURM's
warning, or SLURM stopped it) is queued again too, for as long as each attempt leaves a newer complete
checkpoint than the one before: a job that cannot get past a step within its time limit fails.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.errors import ErrorCode
from ftq.contract.plans import Plan
from ftq.contract.spec import JobSpec
from ftq.planning.render import render_plan
from ftq.runtime.settings import get_settings
from ftq.store import repository
from ftq.store.models import Job
from worker import failures
from worker.launchers.base import RunPhase, RunState

log = logging.getLogger(__name__)

# Failures that say nothing about the job itself: FTQ_RETRY_PREEMPTED queues such a job again.
RETRYABLE = frozenset({ErrorCode.preempted, ErrorCode.node_failure})

_NO_TRACE = "no process and no exit status"
_LOST = failures.Failure(
    ErrorCode.unknown,
    "the run's processes are gone and it left no exit status: it was killed (SIGKILL, e.g. by the "
    "out-of-memory killer) or the host restarted; submit it again, with resume_from to continue from its "
    "last checkpoint",
)


def why_it_failed(run_dir: Path, state: RunState) -> failures.Failure:
    """The error code and message of a run that ended without success."""
    if not run_dir.is_dir():
        # Nothing of the run is left to read (its log, its exit status): say that, not a guess at a kill.
        return failures.Failure(
            ErrorCode.unknown,
            f"the run directory {run_dir.name} was deleted while the job ran (by someone on the host, a "
            "cleanup job, the operator): its log, checkpoints and exit status are gone; submit it again",
        )
    if state.phase == RunPhase.lost and state.exit_code is None:
        reason = state.reason if state.reason and state.reason != _NO_TRACE else None
        failure = failures.classify_run(run_dir, exit_code=None, reason=reason)
        if failure.code != ErrorCode.unknown:
            return failure
        # launch.sh writes the exit status into the run directory whenever the launch ends: a run that
        # left none on a nearly full disk most likely could not write it, nor its last log lines.
        nearly_full = failures.nearly_full(run_dir)
        return nearly_full or _LOST
    # The log tail, the free space and (after a SIGKILL) the kernel's OOM messages.
    return failures.classify_run(run_dir, exit_code=state.exit_code, reason=state.reason)


def should_retry(code: str, attempt: int, retries: int) -> bool:
    return code in RETRYABLE and attempt < retries


def paused_attempts(run_dir: Path) -> int:
    """How many of the run's attempts ended in a pause (runs.PAUSE_RECORD)."""
    try:
        return max(0, int(json.loads((run_dir / runs.PAUSE_RECORD).read_text())["count"]))
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def note_pause(run_dir: Path) -> None:
    """One more attempt ended in a pause: it does not count against FTQ_RETRY_PREEMPTED."""
    tmp = run_dir / f".{runs.PAUSE_RECORD}.tmp"
    tmp.write_text(json.dumps({"count": paused_attempts(run_dir) + 1}))
    tmp.replace(run_dir / runs.PAUSE_RECORD)


def retries_used(attempt: int, run_dir: Path) -> int:
    """The job's attempts that were retries: every attempt after the first, less those a pause ended."""
    return max(0, attempt - paused_attempts(run_dir))


def retry(session: Session, job: Job, run_dir: Path, failure: failures.Failure) -> bool:
    """Queue the job again when the policy allows; True when it was."""
    retries = get_settings().retry_preempted
    if should_retry(failure.code, retries_used(job.attempt, run_dir), retries):
        why = f"attempt {retries_used(job.attempt, run_dir) + 1} of {retries}"
    elif failure.code == ErrorCode.time_limit and _requeue_on_timeout(job):
        step = _progress(run_dir)
        if step is None:
            return False
        why = f"requeue_on_timeout, from step {step}"
    else:
        return False
    runs.set_attempt_aside(run_dir, job.attempt)
    requeued = repository.JOBS.requeue(
        session, job.id, reason=f"{failure.code}: {why}", attempt=Job.attempt + 1
    )
    if not requeued:
        return False
    log.info(
        "job %s ended %s; queued again (%s) to resume from its newest checkpoint", job.id, failure.code, why
    )
    return True


def _requeue_on_timeout(job: Job) -> bool:
    resources = (job.spec or {}).get("resources") or {}
    return resources.get("launcher") == "slurm" and bool(
        (resources.get("slurm") or {}).get("requeue_on_timeout")
    )


def _progress(run_dir: Path) -> int | None:
    """The step of the newest complete checkpoint when it is newer than at the last time-limit requeue
    (recorded in run_dir/requeue.json); None when the attempt got no further."""
    latest = runs.latest_checkpoint(run_dir)
    if latest is None:
        return None
    record = run_dir / runs.REQUEUE_RECORD
    try:
        before = int(json.loads(record.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        before = -1
    if latest.step <= before:
        return None
    tmp = run_dir / f".{runs.REQUEUE_RECORD}.tmp"
    tmp.write_text(json.dumps({"step": latest.step}))
    tmp.replace(record)
    return latest.step


def plan_for_attempt(job: Job, run_dir: Path) -> Plan:
    """The stored plan; for a retried attempt, relaunched from the run's newest checkpoint when it has a
    complete one (a folder cut short by a kill while saving is no reason to resume)."""
    plan = Plan.model_validate(job.plan or {})
    if not job.attempt or runs.latest_checkpoint(run_dir) is None:
        return plan
    again = render_plan(
        JobSpec.model_validate(job.spec),
        job_id=job.id,
        run_dir=run_dir,
        settings=get_settings(),
        resume_from_checkpoint="latest",
        estimate=plan.estimate,
    )
    return plan.model_copy(
        update={
            "launch_script": again.launch_script,
            "sbatch_script": again.sbatch_script,
            "command": again.command,
            "trainer_args": again.trainer_args,
        }
    )
