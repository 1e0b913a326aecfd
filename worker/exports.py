"""The export controller: drives each export through a job's states (queued -> starting -> running ->
succeeded | failed | cancelled) through `worker.lifecycle`, as `worker.controller` drives jobs: the
scheduler lock and `worker.scheduling` for the one slot an export takes of the local pool, the job's
launcher, and `worker.recovery.why_it_failed` for why it failed. What is an export's own is
`ExportKind` here: its row in `ftq.store.exports`, its folder, its request file (export.json) and the
operator's Hub token. An export never runs in the worker: it is `python -m trainer.export` launched into
`<run dir>/exports/<export id>/` (launch.sh locally, job.sbatch on SLURM).

Every function is safe to run twice or concurrently, for the same reasons as the controller's:
compare-and-set transitions in the store (`ftq.store.exports`), and a launch adopted from the export
directory's records when its worker died before storing the handle.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.errors import ErrorCode
from ftq.contract.spec import JobSpec
from ftq.contract.status import LAUNCHED, JobStatus
from ftq.planning.render import render_export_plan
from ftq.runtime import limits
from ftq.runtime.settings import get_settings
from ftq.store import exports as store
from ftq.store import repository
from ftq.store.db import session_scope
from ftq.store.models import Export, Job
from worker import lifecycle, locks, scheduling
from worker.failures import Failure
from worker.launchers.base import Launcher, LaunchHandle, LaunchRequest, RunState
from worker.lifecycle import LauncherFor, RunView

log = logging.getLogger(__name__)
# The operator's Hub token reaches the export's process under this name (huggingface_hub reads it).
HUB_TOKEN_ENV = "HF_TOKEN"  # noqa: S105 (a variable name, not a secret)


@dataclass(frozen=True)
class ExportView(RunView):
    """An export's row as a sweep needs it (`run_dir`: the export's folder, `<run dir>/exports/<id>/`)."""

    job_id: str


def _export_dir(job_id: str, export_id: str) -> Path:
    return runs.export_dir(runs.run_dir(get_settings().runs_dir, job_id), export_id)


def _view(export: Export, job: Job) -> ExportView:
    return ExportView.of(
        export, launcher=job.launcher, run_dir=_export_dir(export.job_id, export.id), job_id=export.job_id
    )


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
    files = {
        runs.EXPORT_REQUEST: json.dumps(request_of(export, job, run_dir), indent=2) + "\n",
        runs.LAUNCH_SCRIPT: plan.launch_script,
    }
    lifecycle.write_attempt_files(export_dir, files)
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
    lifecycle.launch(EXPORTS, export_id, launcher_for)


# Cancel ---------------------------------------------------------------------------------------------------


def cancel(export_id: str, launcher_for: LauncherFor) -> None:
    """SIGTERM (or scancel) a `cancelling` export now; the sweep escalates and records the end."""
    lifecycle.cancel(EXPORTS, export_id, launcher_for)


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
    lifecycle.sweep(_views(list(LAUNCHED)), launcher_for, _reconcile_one, "export")
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
    lifecycle.reconcile_one(EXPORTS, v, launcher, state)


def finish(v: ExportView, launcher: Launcher, state: RunState) -> None:
    """The export's process has ended: record how."""
    lifecycle.finish(EXPORTS, v, launcher, state)


class ExportKind:
    """What `worker.lifecycle` needs of an export: its row in `ftq.store.exports` (with its job's, whose
    launcher and owner it takes), its folder and request; no retries, time limit or metrics of its own."""

    run_noun = "export"

    def label(self, v: ExportView) -> str:
        return f"export {v.id} of job {v.job_id}"

    def job_id(self, v: ExportView) -> str:
        return v.job_id

    def read(self, session: Session, row_id: str) -> tuple[tuple[Export, Job], ExportView] | None:
        export = store.get_export(session, row_id)
        job = repository.get_job(session, export.job_id) if export is not None else None
        if export is None or job is None:
            return None
        return (export, job), _view(export, job)

    def prepare(self, session: Session, v: ExportView) -> bool:
        try:
            _make_dirs(v.run_dir)
        except OSError as exc:
            # No run directory (removed by hand, or a data dir restored without it): nothing to export.
            store.mark_finished(
                session,
                v.id,
                JobStatus.failed,
                error_code=ErrorCode.launch_error,
                error_message=f"the job's run directory cannot hold the export: {exc}"[:2000],
            )
            return False
        return True

    def request(self, row: tuple[Export, Job], v: ExportView) -> LaunchRequest:
        return write_export_dir(*row, v.run_dir)

    def record_launch(self, session: Session, row_id: str, handle: LaunchHandle) -> None:
        store.record_launch(session, row_id, **asdict(handle))

    def mark_running(self, session: Session, row_id: str, handle: LaunchHandle) -> None:
        store.mark_running(session, row_id)  # the handle is recorded already (record_launch)

    def mark_finished(self, session: Session, row_id: str, end: lifecycle.End) -> None:
        store.mark_finished(session, row_id, end.status, **end.errors())

    def requeue(self, session: Session, row_id: str) -> bool:
        return store.requeue(session, row_id)

    def while_running(self, v: ExportView, launcher: Launcher, state: RunState) -> None:
        return None

    def before_end(self, v: ExportView) -> None:
        return None

    def stopped_by_worker(self, v: ExportView) -> Failure | None:
        return None

    def retried(self, session: Session, row: tuple[Export, Job], v: ExportView, failure: Failure) -> bool:
        return False

    def after_cancelled(self, row: tuple[Export, Job], v: ExportView) -> None:
        return None


EXPORTS = ExportKind()
