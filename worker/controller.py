"""The job controller: drives each job through its states. Claim resources, launch, cancel, and bring
every job in line with what its launcher reports. What to do after a failure (retry, requeue, resume
from a checkpoint) is `worker.recovery`'s.

Every function here is safe to run twice or concurrently: the store's compare-and-set transitions
decide who acts, `worker.locks` locks keep two claims from handing out one GPU and two launches of
one job from both starting, and what a launch left behind (run directory, /proc, the scheduler) is
looked at before anything new is started. A worker killed at any point is made whole by the next
`reconcile()`, in this worker or any other.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from ftq import limits, logs, runs
from ftq.errors import ErrorCode
from ftq.render import Plan
from ftq.settings import get_settings
from ftq.spec import JobSpec
from ftq.status import LAUNCHED, JobStatus
from ftq.store import repository
from ftq.store.db import session_scope
from ftq.store.models import Job
from worker import exports, failures, ingest, locks, recovery, scheduling
from worker.files import FileUnavailable, spec_for_run
from worker.launchers import make_launcher
from worker.launchers.base import (
    Launcher,
    LaunchHandle,
    LaunchRequest,
    RunPhase,
    RunRef,
    RunState,
    settle_by_launcher,
)

log = logging.getLogger(__name__)

# A `starting` job younger than this may be between its claim and its launch: leave it alone.
STARTING_GRACE_SECONDS = 15.0


@lru_cache
def get_launcher(name: str) -> Launcher:
    return make_launcher(name, on_exit=_sweep_after_exit)


_sweep_pending = threading.Event()
_sweeping = threading.Lock()


def _sweep_after_exit() -> None:
    """A run this process started ended: settle it, and start what waited for its slots, now rather than
    at the next periodic sweep. Runs ending together share sweeps: one that ends while this process
    sweeps gets one more sweep from the thread sweeping; while another process holds the sweep (the
    periodic one), this waits for it briefly and goes again."""
    _sweep_pending.set()
    while _sweep_pending.is_set():
        if not _sweeping.acquire(blocking=False):
            return  # the thread sweeping now sees the flag when it is done
        try:
            _sweep_pending.clear()
            for _ in range(25):
                if reconcile():
                    break
                time.sleep(0.2)
        finally:
            _sweeping.release()


@dataclass(frozen=True)
class JobView:
    """What a sweep needs of a job row, read once so no session is held across launcher calls."""

    id: str
    status: str
    launcher: str
    external_id: str | None
    pid: int | None
    pid_start_ticks: int | None
    updated_at: datetime
    run_dir: Path
    started_at: datetime | None = None
    limit_seconds: float | None = None  # resources.max_seconds of a local job (SLURM enforces its own)

    @property
    def launched(self) -> bool:
        return bool(self.pid or self.external_id)

    def ref(self) -> RunRef:
        return RunRef(self.id, self.run_dir, self.external_id, self.pid, self.pid_start_ticks)


def _view(job: Job, runs_dir: Path | None = None) -> JobView:
    return JobView(
        id=job.id,
        status=job.status,
        launcher=job.launcher,
        external_id=job.external_id,
        pid=job.pid,
        pid_start_ticks=job.pid_start_ticks,
        updated_at=job.updated_at,
        run_dir=runs.run_dir(runs_dir or get_settings().runs_dir, job.id),
        started_at=job.started_at,
        limit_seconds=job.limit_seconds if job.launcher == "local" else None,
    )


def _age(ts: datetime) -> float:
    ts = ts if ts.tzinfo else ts.replace(tzinfo=UTC)
    return (datetime.now(UTC) - ts).total_seconds()


# Scheduling ---------------------------------------------------------------------------------------------


def schedule() -> list[str]:
    """One scheduler tick: claim resources for the queued jobs `worker.scheduling.decide` starts, fail the
    ones it refuses, and write every other queued job's position, reason and estimated start for the API.
    Returns the ids now `starting` to launch."""
    settings = get_settings()
    claimed: list[str] = []
    with session_scope() as session, locks.scheduler_lock(session):
        now = datetime.now(UTC)
        queued_rows = repository.queued_for_scheduling(session)
        if not queued_rows:
            repository.save_queue(session, {})
            session.commit()
            return claimed
        queued = _queued_jobs(session, queued_rows)
        running = [
            scheduling.RunningJob(
                id=r.id,
                owner=r.owner,
                resources=r.resources,
                started_at=r.started_at.timestamp() if r.started_at else None,
                limit_seconds=r.limit_seconds,
                estimate_seconds=r.estimated_seconds,
                eta_seconds=r.eta_seconds,
            )
            for r in repository.holding_devices(session)
        ]
        # Exports take slots of the same pool (worker.exports): what they hold is not free for jobs.
        running += exports.running_exports(session)
        outcome = scheduling.decide(
            queued, running, settings, now=now.timestamp(), usage=_usage(session, running, now)
        )
        for d in outcome.decisions:
            if d.impossible is not None:
                repository.mark_finished(
                    session, d.job_id, JobStatus.failed, error_code=d.error_code, error_message=d.impossible
                )
            elif repository.mark_starting(session, d.job_id, resources=d.resources):
                claimed.append(d.job_id)
        repository.save_queue(
            session,
            {
                w.job_id: (
                    w.position,
                    w.reason,
                    datetime.fromtimestamp(round(w.estimated_start), UTC) if w.estimated_start else None,
                )
                for w in outcome.waiting
            },
        )
        # Commit inside the lock: the next claimant must see these resources as held.
        session.commit()
    return claimed


def _queued_jobs(session: Session, rows: list[Any]) -> list[scheduling.QueuedJob]:
    # Rows stored before the scheduling columns existed: read from their specs.
    old = repository.specs_of(session, [r.id for r in rows if r.devices is None])
    out = []
    for r in rows:
        if r.id in old:
            out.append(scheduling.QueuedJob.from_spec(r.id, r.owner, old[r.id], seq=r.seq))
            continue
        pool = None
        if r.launcher == "local":
            pool = scheduling.GPUS if r.device == "cuda" else scheduling.CPU_SLOTS
        out.append(
            scheduling.QueuedJob(
                id=r.id,
                owner=r.owner,
                need=scheduling.Need(pool, r.devices if pool else 0),
                priority=r.priority or "normal",
                seq=r.seq,
                limit_seconds=r.limit_seconds,
                estimate_seconds=r.estimated_seconds,
            )
        )
    return out


def _usage(session: Session, running: list[scheduling.RunningJob], now: datetime) -> scheduling.Usage:
    """Owners' decayed usage and their GPU-seconds this quota period (ended runs, plus what the running
    GPU jobs have used so far)."""
    settings = get_settings()
    half_life = settings.fair_share_half_life_hours * 3600
    period = settings.quota_period_hours * 3600
    current = repository.period_start(now, period)
    recent: dict[str, float] = {}
    period_gpu: dict[str, float] = {}
    for row in repository.owner_usage(session):
        recent[row.owner] = repository.recent_usage(row, now, half_life)
        if row.period_start == current:
            period_gpu[row.owner] = row.period_gpu_seconds
    for r in running:
        if r.pool == scheduling.GPUS and r.started_at is not None:
            period_gpu[r.owner] = period_gpu.get(r.owner, 0.0) + r.count * max(
                0.0, now.timestamp() - r.started_at
            )
    return scheduling.Usage(
        recent_device_seconds=recent, period_gpu_seconds=period_gpu, period_ends=current.timestamp() + period
    )


# Launch ---------------------------------------------------------------------------------------------------


def write_run_dir(job: Job, run_dir: Path, plan: Plan) -> None:
    # Owner-only: the run reads these as the worker's user (locally, or as the submitting account on
    # SLURM, where the nodes share the run directory) or through the group a run user gets
    # (worker.launchers.local.share_run_dir); another account on the host reads none of them.
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    run_dir.chmod(0o700)
    (run_dir / runs.CHECKPOINTS).mkdir(mode=0o700, exist_ok=True)
    # Uploaded files (dataset.file_id) become the server's paths of the owner's files here, at launch.
    spec = spec_for_run(job.spec, job.owner, run_dir)
    files = {
        runs.SPEC: json.dumps(spec, indent=2, sort_keys=True) + "\n",
        runs.ACCELERATE_CONFIG: plan.accelerate_config_yaml,
        runs.LAUNCH_SCRIPT: plan.launch_script,
    }
    if plan.sbatch_script:
        files[runs.SBATCH_SCRIPT] = plan.sbatch_script
    for name, text in files.items():
        tmp = run_dir / f".{name}.tmp"
        tmp.unlink(missing_ok=True)
        # Created owner-only (not chmod after writing): no moment in which another account may open it.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        tmp.chmod(0o700 if name in (runs.LAUNCH_SCRIPT, runs.SBATCH_SCRIPT) else 0o600)
        tmp.replace(run_dir / name)
    # Leftovers of an attempt that never started must not be read as this attempt's end.
    for stale in runs.ATTEMPT_RECORDS:
        (run_dir / stale).unlink(missing_ok=True)


@logs.about_job
def launch(job_id: str) -> None:
    """Start the run of a `starting` job, or adopt the one a previous attempt already started."""
    settings = get_settings()
    run_dir = runs.run_dir(settings.runs_dir, job_id)
    with session_scope() as session:
        job = repository.get_job(session, job_id)
        if job is None or job.status not in (JobStatus.starting, JobStatus.cancelling):
            return
    with locks.run_lock(run_dir), session_scope() as session:
        job = repository.get_job(session, job_id)  # again, under the lock: the truth now
        if job is None or job.status not in (JobStatus.starting, JobStatus.cancelling):
            return
        view = _view(job)
        launcher = get_launcher(job.launcher)
        handle: LaunchHandle | None = None
        if view.launched:
            handle = LaunchHandle(job.external_id, job.pid, job.pid_start_ticks)
        else:
            handle = launcher.find(view.run_dir)
        if handle is None:
            if job.status == JobStatus.cancelling:
                repository.mark_finished(
                    session,
                    job_id,
                    JobStatus.cancelled,
                    error_code=ErrorCode.cancelled,
                    error_message="cancelled before it started",
                )
                return
            try:
                plan = recovery.plan_for_attempt(job, run_dir)
                write_run_dir(job, run_dir, plan)
                req = LaunchRequest(
                    job_id=job.id,
                    run_dir=run_dir,
                    spec=JobSpec.model_validate(job.spec),
                    plan=plan,
                    resources=job.resources or {},
                    env={},
                    owner=job.owner,
                )
                handle = launcher.submit(req)
            except FileUnavailable as exc:
                repository.mark_finished(
                    session,
                    job_id,
                    JobStatus.failed,
                    error_code=ErrorCode.dataset_error,
                    error_message=str(exc),
                )
                return
            except Exception as exc:
                log.exception("launch of %s failed", job_id)
                repository.mark_finished(
                    session,
                    job_id,
                    JobStatus.failed,
                    error_code=ErrorCode.launch_error,
                    error_message=f"the run could not be started: {exc}"[:2000],
                )
                return
            log.info("job %s launched: %s", job_id, handle)
        else:
            log.info("job %s: adopting the launch found in its run directory: %s", job_id, handle)
        repository.record_launch(
            session,
            job_id,
            external_id=handle.external_id,
            pid=handle.pid,
            pid_start_ticks=handle.pid_start_ticks,
        )
        # Commit the handle before anything else can fail: it is what makes the run adoptable.
        session.commit()
        repository.mark_running(
            session,
            job_id,
            external_id=handle.external_id,
            pid=handle.pid,
            pid_start_ticks=handle.pid_start_ticks,
        )
        session.commit()
        job = repository.get_job(session, job_id)
        if job is not None and job.status == JobStatus.cancelling:
            # A cancel came in while the launch was under way: act on it now.
            launcher.cancel(_view(job).ref())


def submit(job_id: str) -> None:
    """The `ftq.submit` task: schedule (this job and whatever else fits, oldest first), then launch what
    was claimed. A redelivered submit of a job left `starting` (its worker died) is for reconcile."""
    claimed = schedule()
    for claimed_id in claimed:
        launch(claimed_id)
    if job_id not in claimed:
        log.debug("job %s: not claimed by this submit (it waits for resources, or was already)", job_id)


# Cancel ---------------------------------------------------------------------------------------------------


@logs.about_job
def cancel(job_id: str) -> None:
    """The `ftq.cancel` task: SIGTERM (or scancel) now; reconcile escalates and records the end."""
    with session_scope() as session:
        job = repository.get_job(session, job_id)
        if job is None or job.status != JobStatus.cancelling:
            return
        view = _view(job)
    launcher = get_launcher(view.launcher)
    if view.launched:
        launcher.cancel(view.ref())
        return
    _settle_unlaunched_cancel(view, launcher)


def _settle_unlaunched_cancel(view: JobView, launcher: Launcher) -> None:
    with locks.try_run_lock(view.run_dir) as free:
        if not free:
            return  # a launch is under way; it sees `cancelling` and cancels what it started
        handle = launcher.find(view.run_dir)
        with session_scope() as session:
            if handle is None:
                repository.mark_finished(
                    session,
                    view.id,
                    JobStatus.cancelled,
                    error_code=ErrorCode.cancelled,
                    error_message="cancelled before it started",
                )
            else:
                repository.record_launch(
                    session,
                    view.id,
                    external_id=handle.external_id,
                    pid=handle.pid,
                    pid_start_ticks=handle.pid_start_ticks,
                )


# Reconcile ---------------------------------------------------------------------------------------------


def reconcile() -> bool:
    """The periodic sweep: settle launched jobs, then start queued ones as resources allow. False when
    another sweep was under way (this one did nothing)."""
    with locks.singleton("reconcile") as mine:
        if not mine:
            return False
        with session_scope() as session:
            runs_dir = get_settings().runs_dir  # resolved once, not once per job
            views = [_view(j, runs_dir) for j in repository.jobs_in(session, LAUNCHED, lean=True)]
        settle_by_launcher(views, get_launcher, _reconcile_one, "job")
        for claimed in schedule():
            try:
                launch(claimed)
            except Exception:
                log.exception("launching job %s failed", claimed, extra={"job_id": claimed})
        # Exports run through the same launchers and draw on the same pool, after the jobs' turn.
        try:
            exports.reconcile(get_launcher)
        except Exception:
            log.exception("the export sweep failed; trying again next sweep")
    return True


@logs.about_job
def _reconcile_one(v: JobView, launcher: Launcher, state: RunState | None) -> None:
    if not v.launched:
        if v.status == JobStatus.starting and _age(v.updated_at) < STARTING_GRACE_SECONDS:
            return
        _settle_unlaunched(v, launcher)
        return
    if state is None:
        return
    if state.phase in (RunPhase.pending, RunPhase.running):
        if v.status == JobStatus.starting:
            _mark_running(v)
        elif v.status == JobStatus.cancelling:
            launcher.cancel(v.ref())
        elif v.launcher == "local" and v.started_at is not None and _age(v.started_at) > _local_limit(v):
            _stop_over_time(v, launcher)
        if v.launcher != "local":
            _note_pending(v, state)
        return
    finish(v, launcher, state)


# A local run has no scheduler to enforce a time limit: the worker stops one that outlives the operator's
# (as a cancel does: SIGTERM, SIGKILL after the grace) and leaves this record, so its end reads as
# time_limit rather than as a crash.
TIME_LIMIT_RECORD = "time_limit.json"


def _local_limit(v: JobView) -> float:
    """How long a local run may go: its own resources.max_seconds, within the operator's cap."""
    cap = limits.max_seconds(get_settings())
    return min(v.limit_seconds, cap) if v.limit_seconds else cap


def _stop_over_time(v: JobView, launcher: Launcher) -> None:
    record = v.run_dir / TIME_LIMIT_RECORD
    if not record.exists():
        log.warning("job %s ran longer than its time limit (%.0f s); stopping it", v.id, _local_limit(v))
        record.write_text(json.dumps({"stopped_at": time.time(), "limit_seconds": _local_limit(v)}))
    launcher.cancel(v.ref())


def _time_limit_failure(v: JobView) -> failures.Failure:
    hours = get_settings().max_time_limit_hours
    if v.limit_seconds and v.limit_seconds < hours * 3600:
        return failures.Failure(
            ErrorCode.time_limit,
            f"the job ran longer than its resources.max_seconds ({v.limit_seconds:g} s) and was stopped; "
            "give it more time, or resume it from its last checkpoint with resume_from",
        )
    return failures.Failure(
        ErrorCode.time_limit,
        f"the job ran longer than this server's limit of {hours:g} h (FTQ_MAX_TIME_LIMIT_HOURS) and was "
        "stopped; resume it from its last checkpoint with resume_from",
    )


_noted_pending: set[str] = set()


def _note_pending(v: JobView, state: RunState) -> None:
    """While SLURM holds the job pending, its reason (Priority, Resources, QOSMaxJobsPerUserLimit...) is the
    job's queue.reason; once it runs, no queue (the row goes; the job's end drops it in any case)."""
    if state.phase == RunPhase.pending and state.pending_reason:
        start = state.expected_start
        with session_scope() as session:
            repository.save_queue(
                session,
                {v.id: (None, state.pending_reason, datetime.fromtimestamp(start, UTC) if start else None)},
                local=False,
            )
        _noted_pending.add(v.id)
    elif v.id in _noted_pending:
        with session_scope() as session:
            repository.drop_queue_rows(session, [v.id])
        _noted_pending.discard(v.id)


def _settle_unlaunched(v: JobView, launcher: Launcher) -> None:
    """A `starting`/`cancelling` job with no launch recorded: its worker died mid-launch, or it is slow."""
    with locks.try_run_lock(v.run_dir) as free:
        if not free:
            return  # a launch is in progress right now
        handle = launcher.find(v.run_dir)
        if handle is not None and not (handle.pid or handle.external_id):
            # Only an exit status is left: the run started and has already ended.
            state = launcher.poll([RunRef(v.id, v.run_dir, None, None, None)]).get(v.id)
            if state is not None and state.phase in (RunPhase.exited, RunPhase.lost):
                finish(v, launcher, state)
            return
        with session_scope() as session:
            if handle is not None:
                log.info("job %s: adopting a launch its worker did not record: %s", v.id, handle)
                repository.record_launch(
                    session,
                    v.id,
                    external_id=handle.external_id,
                    pid=handle.pid,
                    pid_start_ticks=handle.pid_start_ticks,
                )
                repository.mark_running(
                    session,
                    v.id,
                    external_id=handle.external_id,
                    pid=handle.pid,
                    pid_start_ticks=handle.pid_start_ticks,
                )
            elif v.status == JobStatus.cancelling:
                repository.mark_finished(
                    session,
                    v.id,
                    JobStatus.cancelled,
                    error_code=ErrorCode.cancelled,
                    error_message="cancelled before it started",
                )
            elif repository.requeue(session, v.id, reason="claimed but never launched (its worker stopped)"):
                log.info("job %s was claimed but never launched (its worker stopped); queued again", v.id)


def _mark_running(v: JobView) -> None:
    with session_scope() as session:
        repository.mark_running(
            session, v.id, external_id=v.external_id, pid=v.pid, pid_start_ticks=v.pid_start_ticks
        )


def _end_log_with_cancel(run_dir: Path, last_step: int | None) -> None:
    """train.log's last line says what a cancel left, for a person reading it: the step, and the
    checkpoint a continued run would start from (the newest complete one, as resume_from: latest takes)."""
    ckpt = runs.latest_checkpoint(run_dir)
    where = ckpt.path.relative_to(run_dir) if ckpt else None
    if ckpt and ckpt.step >= (last_step or 0):
        # The ranks saved on the way out (trainer/preempt.py), at the step they stopped after.
        line = f"ftq: cancelled at step {ckpt.step}; checkpoint saved ({where})"
    elif ckpt:
        line = f"ftq: cancelled at step {last_step}; last checkpoint {where}"
    elif last_step:
        line = f"ftq: cancelled at step {last_step}; no checkpoint saved"
    else:
        line = "ftq: cancelled before the first step"
    with contextlib.suppress(OSError), (run_dir / runs.TRAIN_LOG).open("a", encoding="utf-8") as f:
        f.write(line + "\n")


@logs.about_job
def finish(v: JobView, launcher: Launcher, state: RunState) -> None:
    """The run has ended: take in its last metrics, then record how it ended (or, for a failure the
    recovery policy retries, queue it again)."""
    # Ingest first, so a terminal job's metrics are complete the moment clients see it terminal.
    ingest.ingest_job(v.id)
    launcher.kill_leftovers(v.ref())
    # The run's own start and end where the scheduler knows them (SLURM), else launch and now.
    times: dict[str, Any] = {
        "run_started": datetime.fromtimestamp(state.started_at, UTC) if state.started_at else None,
        "run_ended": datetime.fromtimestamp(state.ended_at, UTC) if state.ended_at else None,
    }
    with session_scope() as session:
        job = repository.get_job(session, v.id)
        if job is None:
            return
        status = job.status
        if status == JobStatus.cancelling:
            repository.mark_finished(
                session,
                v.id,
                JobStatus.cancelled,
                error_code=ErrorCode.cancelled,
                error_message="cancelled on request",
                exit_code=state.exit_code,
                **times,
            )
            _end_log_with_cancel(v.run_dir, job.progress_step)
        elif (
            state.phase == RunPhase.exited
            and state.exit_code == 0
            and not state.reason
            # Stopped by the worker for running too long: its ranks checkpoint and exit 0, as on a cancel.
            and not (v.run_dir / TIME_LIMIT_RECORD).exists()
        ):
            repository.mark_finished(session, v.id, JobStatus.succeeded, exit_code=0, **times)
        elif status in (JobStatus.starting, JobStatus.running):
            if (v.run_dir / TIME_LIMIT_RECORD).exists():
                failure = _time_limit_failure(v)
            else:
                failure = recovery.why_it_failed(v.run_dir, state)
                if recovery.retry(session, job, v.run_dir, failure):
                    return
            repository.mark_finished(
                session,
                v.id,
                JobStatus.failed,
                error_code=failure.code,
                error_message=failure.message,
                exit_code=state.exit_code,
                **times,
            )
    log.info("job %s ended: %s", v.id, state)
