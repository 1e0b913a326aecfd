"""The job controller: drives each job through its states. One scheduler tick (`schedule`) claims devices
for every kind of run (`KINDS`: jobs, and the side runs of `worker.side_runs`: exports, evaluations)
through `worker.scheduling.decide`; then each claim is launched, cancelled and settled through
`worker.lifecycle`, the same for every kind. What is a job's own is `JobKind` here: its run directory,
the operator's time limit on a local run, SLURM's pending reason, the metrics ingested before the end, the
cancel's last line in train.log. What to do after a failure (retry, requeue, resume from a checkpoint) is
`worker.recovery`'s.

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
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.errors import ErrorCode
from ftq.contract.plans import Plan
from ftq.contract.spec import JobSpec
from ftq.contract.status import LAUNCHED, JobStatus
from ftq.runtime import limits, logs
from ftq.runtime.settings import get_settings
from ftq.store import repository
from ftq.store.db import session_scope
from ftq.store.models import DeploymentQueue, EvaluationQueue, ExportQueue, Job, JobQueue
from worker import (
    deployments,
    evaluations,
    exports,
    failures,
    ingest,
    lifecycle,
    locks,
    recovery,
    scheduling,
    training_clients,
)
from worker.files import FileUnavailable, PathChanged, check_local_paths, spec_for_run
from worker.launchers import make_launcher
from worker.launchers.base import Launcher, LaunchRequest, RunPhase, RunState
from worker.lifecycle import RunView

log = logging.getLogger(__name__)


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
class JobView(RunView):
    """A job's row as a sweep needs it (`run_dir`: its run directory)."""

    started_at: datetime | None = None
    limit_seconds: float | None = None  # resources.max_seconds of a local job (SLURM enforces its own)
    pause_requested: bool = False  # a pause was asked of its run: stop it with a checkpoint


def _view(job: Job, runs_dir: Path | None = None) -> JobView:
    return JobView.of(
        job,
        launcher=job.launcher,
        run_dir=runs.run_dir(runs_dir or get_settings().runs_dir, job.id),
        started_at=job.started_at,
        limit_seconds=job.limit_seconds if job.launcher == "local" else None,
        pause_requested=job.pause_requested_at is not None,
    )


# Scheduling ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A run the scheduler claimed devices for (now `starting`): which kind, which row."""

    kind: str  # a `worker.scheduling` kind: "job", "export"
    id: str


def schedule() -> list[Claim]:
    """One scheduler tick over every kind of run: claim devices for the queued runs
    `worker.scheduling.decide` starts, fail the ones it refuses, and write every other queued job's
    position, reason and estimated start for the API. Returns the runs now `starting` to launch."""
    settings = get_settings()
    claimed: list[Claim] = []
    with session_scope() as session, locks.scheduler_lock(session):
        now = datetime.now(UTC)
        repository.hold_paused(session)  # paused before their claim was launched: never placed
        queued = [r for kind in KINDS.values() for r in kind.queued(session)]
        if not queued:
            repository.save_queue(session, {})
            repository.save_queue(session, {}, table=ExportQueue)
            repository.save_queue(session, {}, table=EvaluationQueue)
            repository.save_queue(session, {}, table=DeploymentQueue)
            session.commit()
            return claimed
        running = [r for kind in KINDS.values() for r in kind.holding(session)]
        outcome = scheduling.decide(
            queued, running, settings, now=now.timestamp(), usage=_usage(session, running, now)
        )
        for d in outcome.decisions:
            transitions = KINDS[d.kind].transitions
            if d.impossible is not None:
                end = lifecycle.End(JobStatus.failed, d.error_code, d.impossible)
                end.record(session, transitions, d.id)
            elif transitions.mark_starting(session, d.id, resources=d.resources):
                claimed.append(Claim(d.kind, d.id))
        # What the API shows of each waiting run: jobs and exports wait in one queue, each kind's rows
        # in its own table.
        queues = (
            (scheduling.JOB, JobQueue),
            (scheduling.EXPORT, ExportQueue),
            (scheduling.EVALUATION, EvaluationQueue),
            (scheduling.DEPLOYMENT, DeploymentQueue),
        )
        for kind, table in queues:
            repository.save_queue(
                session,
                {
                    w.id: (w.position, w.reason, lifecycle.utc(round(w.estimated_start or 0)))
                    for w in outcome.waiting
                    if w.kind == kind
                },
                table=table,
            )
        # Commit inside the lock: the next claimant must see these resources as held.
        session.commit()
    return claimed


def start_claimed(claimed: list[Claim]) -> None:
    """Launch what a tick claimed; one that fails to launch is logged and left to the sweep."""
    for c in claimed:
        try:
            if c.kind == scheduling.JOB:
                launch(c.id)
            else:
                lifecycle.launch(KINDS[c.kind], c.id, get_launcher)
        except Exception:
            # A record about a job carries its id (an export's job is not known here).
            about = {"job_id": c.id} if c.kind == scheduling.JOB else {}
            log.exception("launching %s %s failed", c.kind, c.id, extra=about)


def _queued_jobs(session: Session) -> list[scheduling.RunRequest]:
    rows = repository.queued_for_scheduling(session)
    # Rows stored before the scheduling columns existed: read from their specs.
    old = repository.specs_of(session, [r.id for r in rows if r.devices is None])
    out = []
    for r in rows:
        submitted = r.created_at.timestamp()
        if r.id in old:
            out.append(
                scheduling.RunRequest.from_spec(r.id, r.owner, old[r.id], seq=r.seq, submitted=submitted)
            )
            continue
        pool = scheduling.pool_of(r.launcher, r.device)
        out.append(
            scheduling.RunRequest(
                id=r.id,
                owner=r.owner,
                need=scheduling.Need(pool, r.devices if pool else 0),
                priority=r.priority or "normal",
                seq=r.seq,
                limit_seconds=r.limit_seconds,
                estimate_seconds=r.estimated_seconds,
                submitted=submitted,
            )
        )
    return out


def _jobs_holding(session: Session) -> list[scheduling.Running]:
    return [
        scheduling.Running.of(
            r, limit_seconds=r.limit_seconds, estimate_seconds=r.estimated_seconds, eta_seconds=r.eta_seconds
        )
        for r in repository.holding_devices(session)
    ]


def _usage(session: Session, running: list[scheduling.Running], now: datetime) -> scheduling.Usage:
    """Owners' decayed usage and their GPU-seconds this quota period (ended runs, plus what the running
    GPU runs of every kind have used so far)."""
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
    check_local_paths(job.spec)
    # Uploaded files (dataset.file_id) become the server's paths of the owner's files here, at launch.
    spec = spec_for_run(job.spec, job.owner, run_dir)
    files = {
        runs.SPEC: json.dumps(spec, indent=2, sort_keys=True) + "\n",
        runs.ACCELERATE_CONFIG: plan.accelerate_config_yaml,
        runs.LAUNCH_SCRIPT: plan.launch_script,
    }
    if plan.sbatch_script:
        files[runs.SBATCH_SCRIPT] = plan.sbatch_script
    lifecycle.write_attempt_files(run_dir, files)


@logs.about_job
def launch(job_id: str) -> None:
    """Start the run of a `starting` job, or adopt the one a previous attempt already started."""
    lifecycle.launch(JOBS, job_id, get_launcher)


def submit(job_id: str) -> None:
    """The `ftq.submit` task: schedule (this job and whatever else fits), then launch what was claimed. A
    redelivered submit of a job left `starting` (its worker died) is for reconcile."""
    claimed = schedule()
    start_claimed(claimed)
    if Claim(scheduling.JOB, job_id) not in claimed:
        log.debug("job %s: not claimed by this submit (it waits for resources, or was already)", job_id)


def evaluations_changed(job_id: str) -> None:
    """The `ftq.evaluations` task (an evaluation of this job was queued or cancelled): cancel its
    `cancelling` evaluations, then schedule and launch what fits."""
    evaluations.cancel_requested(job_id, get_launcher)
    start_claimed(schedule())


def deployments_changed(deployment_id: str) -> None:
    """The `ftq.deployments` task (a deployment was asked for or stopped): stop the `cancelling` ones,
    then schedule and launch what fits."""
    deployments.DEPLOYMENTS_KIND.cancel_requested(get_launcher)
    start_claimed(schedule())


def training_clients_changed(model_id: str) -> None:
    """The `ftq.training_clients` task (a Tinker training client was asked for or stopped): stop the
    `cancelling` ones, then schedule and launch what fits."""
    training_clients.TRAINING_CLIENTS_KIND.cancel_requested(get_launcher)
    start_claimed(schedule())


def exports_changed(job_id: str) -> None:
    """The `ftq.exports` task (an export of this job was requested or cancelled): cancel its `cancelling`
    exports, then schedule and launch what fits."""
    exports.cancel_requested(job_id, get_launcher)
    start_claimed(schedule())


# Cancel ---------------------------------------------------------------------------------------------------


@logs.about_job
def cancel(job_id: str) -> None:
    """The `ftq.cancel` task: SIGTERM (or scancel) now; reconcile escalates and records the end."""
    lifecycle.cancel(JOBS, job_id, get_launcher)


# Reconcile ---------------------------------------------------------------------------------------------


def reconcile() -> bool:
    """The periodic sweep: settle launched jobs and exports, then start queued ones as resources allow.
    False when another sweep was under way (this one did nothing)."""
    with locks.singleton("reconcile") as mine:
        if not mine:
            return False
        with session_scope() as session:
            runs_dir = get_settings().runs_dir  # resolved once, not once per job
            views = [_view(j, runs_dir) for j in repository.jobs_in(session, LAUNCHED, lean=True)]
        lifecycle.sweep(views, get_launcher, _reconcile_one, "job")
        # Exports run through the same launchers; what they free is scheduled in the same tick.
        try:
            exports.sweep(get_launcher)
        except Exception:
            log.exception("the export sweep failed; trying again next sweep")
        try:
            evaluations.sweep(get_launcher)
        except Exception:
            log.exception("the evaluation sweep failed; trying again next sweep")
        try:
            deployments.DEPLOYMENTS_KIND.sweep(get_launcher)
        except Exception:
            log.exception("the deployment sweep failed; trying again next sweep")
        try:
            training_clients.TRAINING_CLIENTS_KIND.sweep(get_launcher)
        except Exception:
            log.exception("the training client sweep failed; trying again next sweep")
        start_claimed(schedule())
    return True


@logs.about_job
def _reconcile_one(v: JobView, launcher: Launcher, state: RunState | None) -> None:
    lifecycle.reconcile_one(JOBS, v, launcher, state)


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


def _end_log_with_pause(run_dir: Path, last_step: int | None, ckpt: runs.CheckpointDir | None) -> None:
    """train.log's last line says where a pause left the run, and where a resume continues from."""
    if ckpt is not None:
        line = (
            f"ftq: paused at step {last_step or ckpt.step}; a resume continues from "
            f"{ckpt.path.relative_to(run_dir)}"
        )
    else:
        line = (
            f"ftq: paused at step {last_step or 0}; no checkpoint saved, a resume starts from the beginning"
        )
    with contextlib.suppress(OSError), (run_dir / runs.TRAIN_LOG).open("a", encoding="utf-8") as f:
        f.write(line + "\n")


class JobKind:
    """What `worker.lifecycle` needs of a job: its row in `ftq.store.repository` (its transitions
    `repository.JOBS`), what it asks of the scheduler, and its own steps."""

    name = scheduling.JOB
    run_noun = "run"
    transitions = repository.JOBS

    def queued(self, session: Session) -> list[scheduling.RunRequest]:
        return _queued_jobs(session)

    def holding(self, session: Session) -> list[scheduling.Running]:
        return _jobs_holding(session)

    def label(self, v: JobView) -> str:
        return f"job {v.id}"

    def job_id(self, v: JobView) -> str:
        return v.id

    def read(self, session: Session, row_id: str) -> tuple[Job, JobView] | None:
        job = repository.get_job(session, row_id)
        return None if job is None else (job, _view(job))

    def prepare(self, session: Session, v: JobView) -> bool:
        # The run lock makes the run directory; write_run_dir makes it private. A claim paused before
        # its launch is held instead (its devices go back).
        if v.pause_requested and v.status == JobStatus.starting and not v.launched:
            repository.mark_paused(session, v.id, attempt=None, checkpoint=None)
            return False
        return True

    def request(self, row: Job, v: JobView) -> LaunchRequest:
        try:
            plan = recovery.plan_for_attempt(row, v.run_dir)
            write_run_dir(row, v.run_dir, plan)
        except FileUnavailable as exc:
            raise lifecycle.Refused(ErrorCode.dataset_error, str(exc)) from exc
        except PathChanged as exc:
            raise lifecycle.Refused(ErrorCode(exc.code), str(exc)) from exc
        return LaunchRequest(
            job_id=row.id,
            run_dir=v.run_dir,
            spec=JobSpec.model_validate(row.spec),
            plan=plan,
            resources=row.resources or {},
            env={},
            owner=row.owner,
        )

    def while_running(self, v: JobView, launcher: Launcher, state: RunState) -> None:
        if v.pause_requested and v.status in repository.PAUSABLE:
            # As a cancel stops a run: its ranks checkpoint at their next step and exit (SIGKILL after
            # the grace); the run's end is then recorded as paused (`held`).
            launcher.cancel(v.ref())
            return
        if (
            v.status == JobStatus.running
            and v.launcher == "local"
            and v.started_at is not None
            and lifecycle.age(v.started_at) > _local_limit(v)
        ):
            _stop_over_time(v, launcher)
        if v.launcher != "local":
            _note_pending(v, state)

    def before_end(self, v: JobView) -> None:
        # Ingest first, so a terminal job's metrics are complete the moment clients see it terminal.
        ingest.ingest_job(v.id)

    def stopped_by_worker(self, v: JobView) -> failures.Failure | None:
        # Stopped for running too long: its ranks checkpoint and exit 0, as on a cancel.
        return _time_limit_failure(v) if (v.run_dir / TIME_LIMIT_RECORD).exists() else None

    def retried(self, session: Session, row: Job, v: JobView, failure: failures.Failure) -> bool:
        return recovery.retry(session, row, v.run_dir, failure)

    def after_cancelled(self, row: Job, v: JobView) -> None:
        _end_log_with_cancel(v.run_dir, row.progress_step)

    def held(self, session: Session, row: Job, v: JobView, state: RunState) -> bool:
        if row.pause_requested_at is None:
            return False
        if (
            state.phase == RunPhase.exited
            and state.exit_code == 0
            and runs.has_weights(v.run_dir / runs.FINAL)
        ):
            return False  # it reached its last step (and saved its model) before the pause came
        ckpt = runs.latest_checkpoint(v.run_dir)
        step = ckpt.step if ckpt is not None else None
        ended = lifecycle.utc(state.ended_at)
        if not repository.mark_paused(
            session, row.id, attempt=row.attempt + 1, checkpoint=step, run_ended=ended
        ):
            return False
        # The next launch is a new attempt: it resumes from the newest checkpoint (plan_for_attempt).
        runs.set_attempt_aside(v.run_dir, row.attempt)
        recovery.note_pause(v.run_dir)  # a pause's attempt is no retry (FTQ_RETRY_PREEMPTED)
        _end_log_with_pause(v.run_dir, row.progress_step, ckpt)
        log.info("job %s paused at step %s (checkpoint %s)", row.id, row.progress_step, step)
        return True


JOBS = JobKind()
# Every kind of run the scheduler places, by its `worker.scheduling` kind.
KINDS: dict[str, lifecycle.Kind[Any, Any]] = {
    JOBS.name: JOBS,
    exports.EXPORTS.name: exports.EXPORTS,
    evaluations.EVALUATIONS_KIND.name: evaluations.EVALUATIONS_KIND,
    deployments.DEPLOYMENTS_KIND.name: deployments.DEPLOYMENTS_KIND,
    training_clients.TRAINING_CLIENTS_KIND.name: training_clients.TRAINING_CLIENTS_KIND,
}
