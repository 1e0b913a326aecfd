"""What happens after a run fails: why it failed, whether it goes round again, and from where.

The controller (`worker.controller`) asks two questions when a run ends badly: `why_it_failed` (an error
code and a message a user can act on) and `retry` (is this a failure that says nothing about the job
itself, and does the operator's policy allow another attempt?). A retried job is queued again and its
next launch resumes from the run's newest checkpoint (`plan_for_attempt`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy.orm import Session

from ftq import runs
from ftq.errors import ErrorCode
from ftq.render import Plan, render_plan
from ftq.settings import get_settings
from ftq.spec import JobSpec
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
    if state.phase == RunPhase.lost and state.exit_code is None:
        reason = state.reason if state.reason and state.reason != _NO_TRACE else None
        failure = failures.classify_run(run_dir, exit_code=None, reason=reason)
        return _LOST if failure.code == ErrorCode.unknown else failure
    # The log tail, the free space and (after a SIGKILL) the kernel's OOM messages.
    return failures.classify_run(run_dir, exit_code=state.exit_code, reason=state.reason)


def should_retry(code: str, attempt: int, retries: int) -> bool:
    return code in RETRYABLE and attempt < retries


def retry(session: Session, job: Job, run_dir: Path, failure: failures.Failure) -> bool:
    """Queue the job again when the policy allows; True when it was."""
    retries = get_settings().retry_preempted
    if not should_retry(failure.code, job.attempt, retries):
        return False
    runs.set_attempt_aside(run_dir, job.attempt)
    if not repository.requeue(session, job.id, attempt_increment=1):
        return False
    log.info(
        "job %s ended %s; queued again (attempt %d of %d) to resume from its newest checkpoint",
        job.id,
        failure.code,
        job.attempt + 1,
        retries,
    )
    return True


def plan_for_attempt(job: Job, run_dir: Path) -> Plan:
    """The stored plan; for a retried attempt, relaunched from the run's newest checkpoint when it has one."""
    plan = Plan.model_validate(job.plan or {})
    if not job.attempt or not runs.has_checkpoint(run_dir):
        return plan
    again = render_plan(
        JobSpec.model_validate(job.spec),
        job_id=job.id,
        run_dir=run_dir,
        settings=get_settings(),
        resume_from_checkpoint="latest",
    )
    return plan.model_copy(
        update={
            "launch_script": again.launch_script,
            "sbatch_script": again.sbatch_script,
            "command": again.command,
            "trainer_args": again.trainer_args,
        }
    )
