"""The export controller: drives each export through a job's states (queued -> starting -> running ->
succeeded | failed | cancelled) as `worker.controller` drives jobs, with the same pieces: the scheduler
lock and `worker.scheduling` for the one slot an export takes of the local pool, the run lock around a
launch, the job's launcher (`submit`, `poll`, `cancel`, `find`), and `worker.recovery.why_it_failed` for
why it failed. An export never runs in the worker: it is `python -m trainer.export` launched into
`<run dir>/exports/<export id>/` (launch.sh locally, job.sbatch on SLURM).

Every function is safe to run twice or concurrently, for the same reasons as the controller's:
compare-and-set transitions in the store (`ftq.store.exports`), and a launch adopted from the export
directory's records when its worker died before storing the handle.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ftq import limits, runs
from ftq.errors import ErrorCode
from ftq.render import render_export_plan
from ftq.settings import get_settings
from ftq.spec import JobSpec
from ftq.status import LAUNCHED, JobStatus
from ftq.store import exports as store
from ftq.store import repository
from ftq.store.db import session_scope
from ftq.store.models import Export, Job
from worker import locks, recovery, scheduling
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

LauncherFor = Callable[[str], Launcher]

# A `starting` export younger than this may be between its claim and its launch: leave it alone.
STARTING_GRACE_SECONDS = 15.0
# The operator's Hub token reaches the export's process under this name (huggingface_hub reads it).
HUB_TOKEN_ENV = "HF_TOKEN"  # noqa: S105 (a variable name, not a secret)


@dataclass(frozen=True)
class ExportView:
    """What a sweep needs of an export row, read once so no session is held across launcher calls."""

    id: str
    job_id: str
    status: str
    launcher: str
    external_id: str | None
    pid: int | None
    pid_start_ticks: int | None
    updated_at: datetime
    export_dir: Path

    @property
    def launched(self) -> bool:
        return bool(self.pid or self.external_id)

    def ref(self) -> RunRef:
        return RunRef(self.id, self.export_dir, self.external_id, self.pid, self.pid_start_ticks)


def _export_dir(job_id: str, export_id: str) -> Path:
    return runs.export_dir(runs.run_dir(get_settings().runs_dir, job_id), export_id)


def _view(export: Export, job: Job) -> ExportView:
    return ExportView(
        id=export.id,
        job_id=export.job_id,
        status=export.status,
        launcher=job.launcher,
        external_id=export.external_id,
        pid=export.pid,
        pid_start_ticks=export.pid_start_ticks,
        updated_at=export.updated_at,
        export_dir=_export_dir(export.job_id, export.id),
    )


def _age(ts: datetime) -> float:
    ts = ts if ts.tzinfo else ts.replace(tzinfo=UTC)
    return (datetime.now(UTC) - ts).total_seconds()


def need_spec(job_spec: dict[str, Any]) -> dict[str, Any]:
    """What an export asks of the pool, in a spec's words: one process on the job's launcher and device."""
    res = job_spec.get("resources") or {}
    return {
        "resources": {
            "launcher": res.get("launcher", "local"),
            "device": res.get("device", "cuda"),
            "num_nodes": 1,
            "processes_per_node": 1,
        }
    }


# Scheduling -----------------------------------------------------------------------------------------------


def schedule() -> list[str]:
    """Claim one slot for each queued export that fits, oldest first; the ids now `starting`. Jobs and
    exports draw on one pool: what either holds is taken (`held`), and the jobs' scheduler counts what
    exports hold (`worker.controller.schedule`)."""
    settings = get_settings()
    claimed: list[str] = []
    with session_scope() as session, locks.scheduler_lock(session):
        queued = store.exports_in(session, [JobStatus.queued])
        if not queued:
            return claimed
        held = [r.resources for r in repository.holding_devices(session)] + store.held_resources(session)
        free_gpus, free_slots = scheduling.free_resources(settings, held)
        for e in queued:
            job = repository.get_job(session, e.job_id)
            need = scheduling.need_of(need_spec(job.spec if job is not None else {}))
            resources: dict[str, Any] | None = None
            if need.pool is None:
                resources = {}
            elif (beyond := limits.beyond_local_pool(_device(need), need.count, settings)) is not None:
                store.mark_finished(
                    session,
                    e.id,
                    JobStatus.failed,
                    error_code=ErrorCode.launch_error,
                    error_message=beyond[1],
                )
                continue
            elif need.pool == scheduling.GPUS and free_gpus:
                resources, free_gpus = {scheduling.GPUS: free_gpus[:1]}, free_gpus[1:]
            elif need.pool == scheduling.CPU_SLOTS and free_slots >= 1:
                resources, free_slots = {scheduling.CPU_SLOTS: 1}, free_slots - 1
            if resources is not None and store.mark_starting(session, e.id, resources=resources):
                claimed.append(e.id)
        session.commit()
    return claimed


def _device(need: scheduling.Need) -> str:
    return "cuda" if need.pool == scheduling.GPUS else "cpu"


def running_exports(session: Any) -> list[scheduling.RunningJob]:
    """Exports holding devices, as the jobs' scheduler sees what holds the pool (their owner's, for usage)."""
    out = []
    for e in store.exports_in(session, list(LAUNCHED)):
        job = repository.get_job(session, e.job_id)
        if e.resources and job is not None:
            started = e.started_at.timestamp() if e.started_at else None
            out.append(
                scheduling.RunningJob(id=e.id, owner=job.owner, resources=e.resources, started_at=started)
            )
    return out


# Launch ---------------------------------------------------------------------------------------------------


def _write_private(path: Path, text: str, mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.chmod(mode)
    tmp.replace(path)


def request_of(export: Export, job: Job, run_dir: Path) -> dict[str, Any]:
    """export.json: everything `trainer.export` needs (paths the server chose, never a client)."""
    plan_command = (job.plan or {}).get("command") or []
    return {
        "export_id": export.id,
        "job_id": job.id,
        "kind": export.kind,
        "dtype": export.dtype,
        "max_shard_size": export.max_shard_size,
        "push_to_hub": export.push_to_hub,
        "run_dir": str(run_dir),
        "out_dir": str(runs.export_dir(run_dir, export.id)),
        # Remote code only where the operator's policy let the job itself run it (its rendered plan).
        "trust_remote_code": "--trust_remote_code" in plan_command,
    }


def write_export_dir(export: Export, job: Job, export_dir: Path) -> LaunchRequest:
    settings = get_settings()
    run_dir = export_dir.parent.parent
    spec = JobSpec.model_validate(job.spec)
    plan = render_export_plan(spec, export_id=export.id, export_dir=export_dir, settings=settings)
    _write_private(
        export_dir / runs.EXPORT_REQUEST, json.dumps(request_of(export, job, run_dir), indent=2) + "\n"
    )
    _write_private(export_dir / runs.LAUNCH_SCRIPT, plan.launch_script, 0o700)
    for stale in runs.ATTEMPT_RECORDS:
        (export_dir / stale).unlink(missing_ok=True)
    env: dict[str, str] = {}
    if export.push_to_hub and settings.hub_token:
        env[HUB_TOKEN_ENV] = settings.hub_token
    return LaunchRequest(
        job_id=export.id,
        run_dir=export_dir,
        spec=spec,
        plan=plan,
        resources=export.resources or {},
        env=env,
        owner=job.owner,
    )


def _make_dirs(export_dir: Path) -> None:
    parent, run_dir = export_dir.parent, export_dir.parent.parent
    parent.mkdir(mode=0o700, exist_ok=True)
    info = run_dir.stat()
    if info.st_gid != os.getegid() and os.geteuid() == 0:
        # A run user's run directory (worker.launchers.local.share_run_dir): its group enters exports/.
        os.chown(parent, -1, info.st_gid)
        parent.chmod(0o750)
    export_dir.mkdir(mode=0o700, exist_ok=True)


def launch(export_id: str, launcher_for: LauncherFor) -> None:
    """Start the launch of a `starting` export, or adopt the one a previous attempt already started."""
    with session_scope() as session:
        export = store.get_export(session, export_id)
        if export is None or export.status not in (JobStatus.starting, JobStatus.cancelling):
            return
        export_dir = _export_dir(export.job_id, export.id)
        try:
            _make_dirs(export_dir)
        except OSError as exc:
            # No run directory (removed by hand, or a data dir restored without it): nothing to export.
            store.mark_finished(
                session,
                export_id,
                JobStatus.failed,
                error_code=ErrorCode.launch_error,
                error_message=f"the job's run directory cannot hold the export: {exc}"[:2000],
            )
            return
    with locks.run_lock(export_dir), session_scope() as session:
        export = store.get_export(session, export_id)  # again, under the lock: the truth now
        job = repository.get_job(session, export.job_id) if export is not None else None
        if export is None or job is None or export.status not in (JobStatus.starting, JobStatus.cancelling):
            return
        view = _view(export, job)
        launcher = launcher_for(job.launcher)
        handle = (
            LaunchHandle(export.external_id, export.pid, export.pid_start_ticks) if view.launched else None
        )
        if handle is None:
            handle = launcher.find(export_dir)
        if handle is None:
            if export.status == JobStatus.cancelling:
                store.mark_finished(
                    session,
                    export_id,
                    JobStatus.cancelled,
                    error_code=ErrorCode.cancelled,
                    error_message="cancelled before it started",
                )
                return
            try:
                handle = launcher.submit(write_export_dir(export, job, export_dir))
            except Exception as exc:
                log.exception("launch of export %s failed", export_id)
                store.mark_finished(
                    session,
                    export_id,
                    JobStatus.failed,
                    error_code=ErrorCode.launch_error,
                    error_message=f"the export could not be started: {exc}"[:2000],
                )
                return
            log.info("export %s of job %s launched: %s", export_id, job.id, handle)
        store.record_launch(
            session,
            export_id,
            external_id=handle.external_id,
            pid=handle.pid,
            pid_start_ticks=handle.pid_start_ticks,
        )
        session.commit()  # the handle first: it is what makes the launch adoptable
        store.mark_running(session, export_id)
        session.commit()
        export = store.get_export(session, export_id)
        if export is not None and export.status == JobStatus.cancelling:
            launcher.cancel(_view(export, job).ref())


# Cancel ---------------------------------------------------------------------------------------------------


def cancel(export_id: str, launcher_for: LauncherFor) -> None:
    """SIGTERM (or scancel) a `cancelling` export now; the sweep escalates and records the end."""
    with session_scope() as session:
        export = store.get_export(session, export_id)
        job = repository.get_job(session, export.job_id) if export is not None else None
        if export is None or job is None or export.status != JobStatus.cancelling:
            return
        view = _view(export, job)
    if view.launched:
        launcher_for(view.launcher).cancel(view.ref())


# Reconcile ------------------------------------------------------------------------------------------------


def _views(statuses: tuple[str, ...] | list[str], job_id: str | None = None) -> list[ExportView]:
    with session_scope() as session:
        out = []
        for e in store.exports_in(session, statuses):
            if job_id is not None and e.job_id != job_id:
                continue
            job = repository.get_job(session, e.job_id)
            if job is not None:
                out.append(_view(e, job))
        return out


def reconcile(launcher_for: LauncherFor) -> None:
    """Settle launched exports, then start queued ones as the pool allows. The caller holds the
    reconcile singleton (`worker.controller.reconcile`)."""
    settle_by_launcher(_views(list(LAUNCHED)), launcher_for, _reconcile_one, "export")
    start_claimed(launcher_for)


def start_claimed(launcher_for: LauncherFor) -> None:
    for claimed in schedule():
        try:
            launch(claimed, launcher_for)
        except Exception:
            log.exception("launching export %s failed", claimed)


def wake(job_id: str, launcher_for: LauncherFor) -> None:
    """The `ftq.exports` task: cancel this job's `cancelling` exports and start what fits, now."""
    for v in _views([JobStatus.cancelling], job_id):
        cancel(v.id, launcher_for)
    start_claimed(launcher_for)


def _reconcile_one(v: ExportView, launcher: Launcher, state: RunState | None) -> None:
    if not v.launched:
        if v.status == JobStatus.starting and _age(v.updated_at) < STARTING_GRACE_SECONDS:
            return
        _settle_unlaunched(v, launcher)
        return
    if state is None:
        return
    if state.phase in (RunPhase.pending, RunPhase.running):
        if v.status == JobStatus.starting:
            with session_scope() as session:
                store.mark_running(session, v.id)
        elif v.status == JobStatus.cancelling:
            launcher.cancel(v.ref())
        return
    finish(v, launcher, state)


def _settle_unlaunched(v: ExportView, launcher: Launcher) -> None:
    """A `starting`/`cancelling` export with no launch recorded: its worker died mid-launch."""
    with locks.try_run_lock(v.export_dir) as free:
        if not free:
            return
        handle = launcher.find(v.export_dir) if v.export_dir.is_dir() else None
        if handle is not None and not (handle.pid or handle.external_id):
            state = launcher.poll([RunRef(v.id, v.export_dir, None, None, None)]).get(v.id)
            if state is not None and state.phase in (RunPhase.exited, RunPhase.lost):
                finish(v, launcher, state)
            return
        with session_scope() as session:
            if handle is not None:
                store.record_launch(
                    session,
                    v.id,
                    external_id=handle.external_id,
                    pid=handle.pid,
                    pid_start_ticks=handle.pid_start_ticks,
                )
                store.mark_running(session, v.id)
            elif v.status == JobStatus.cancelling:
                store.mark_finished(
                    session,
                    v.id,
                    JobStatus.cancelled,
                    error_code=ErrorCode.cancelled,
                    error_message="cancelled before it started",
                )
            elif store.requeue(session, v.id):
                log.info("export %s was claimed but never launched (its worker stopped); queued again", v.id)


def finish(v: ExportView, launcher: Launcher, state: RunState) -> None:
    """The export's process has ended: record how."""
    launcher.kill_leftovers(v.ref())
    with session_scope() as session:
        export = store.get_export(session, v.id)
        if export is None:
            return
        if export.status == JobStatus.cancelling:
            store.mark_finished(
                session,
                v.id,
                JobStatus.cancelled,
                error_code=ErrorCode.cancelled,
                error_message="cancelled on request",
                exit_code=state.exit_code,
            )
        elif state.phase == RunPhase.exited and state.exit_code == 0 and not state.reason:
            store.mark_finished(session, v.id, JobStatus.succeeded, exit_code=0)
        else:
            failure = recovery.why_it_failed(v.export_dir, state)
            store.mark_finished(
                session,
                v.id,
                JobStatus.failed,
                error_code=failure.code,
                error_message=failure.message,
                exit_code=state.exit_code,
            )
    log.info("export %s of job %s ended: %s", v.id, v.job_id, state)
