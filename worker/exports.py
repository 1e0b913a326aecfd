"""The export controller: drives each export through a job's states (queued -> starting -> running ->
succeeded | failed | cancelled) through `worker.lifecycle`, as `worker.controller` drives jobs: the one
scheduler (`worker.controller.schedule`, `worker.scheduling.decide`) places the one slot an export takes of
the local pool with the jobs, under the same quotas, fair share and reservation; the job's launcher, and
`worker.recovery.why_it_failed` for why it failed. What is an export's own is `ExportKind` here: its row
in `ftq.store.exports` (its transitions `EXPORTS`), what it asks of the scheduler, its folder, its request
file (export.json) and the operator's Hub token. An export never runs in the worker: it is
`python -m trainer.export` launched into `<run dir>/exports/<export id>/` (launch.sh locally, job.sbatch
on SLURM).

Every function is safe to run twice or concurrently, for the same reasons as the controller's:
compare-and-set transitions in the store (`ftq.store.transitions`), and a launch adopted from the export
directory's records when its worker died before storing the handle.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.errors import ErrorCode
from ftq.contract.spec import JobSpec
from ftq.contract.status import LAUNCHED, JobStatus
from ftq.planning.render import render_export_plan
from ftq.runtime.settings import get_settings
from ftq.store import evaluations, repository
from ftq.store import exports as store
from ftq.store.db import session_scope
from ftq.store.models import Export, Job
from worker import lifecycle, scheduling
from worker.failures import Failure
from worker.launchers.base import Launcher, LaunchRequest, RunState
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


# An export loads the model and writes it out again: minutes, whatever the training took. What the scheduler
# expects it to hold its slot for, so a reservation behind it can be told; it has no time limit of its
# own, so it backfills only onto devices a reservation leaves spare.
ESTIMATE_SECONDS = 600.0


def _run_request(row: Any) -> scheduling.RunRequest:
    """A queued export as the scheduler weighs it: one process on its job's launcher and device, its
    job's owner and priority, submitted when it was requested."""
    pool = scheduling.pool_of(row.launcher, row.device)
    return scheduling.RunRequest(
        id=row.id,
        owner=row.owner,
        need=scheduling.Need(pool, 1 if pool else 0),
        priority=row.priority or "normal",
        seq=row.seq,
        estimate_seconds=ESTIMATE_SECONDS,
        kind=scheduling.EXPORT,
        submitted=row.created_at.timestamp(),
    )


# Launch ---------------------------------------------------------------------------------------------------


def request_of(export: Export, job: Job, run_dir: Path) -> dict[str, Any]:
    """export.json: everything `trainer.export` needs (paths the server chose, never a client)."""
    plan_command = (job.plan or {}).get("command") or []
    checkpoint: dict[str, Any] = {}
    if export.step is not None:
        # A checkpoint's export, with what its evaluations scored for the model card.
        with session_scope() as session:
            rows = evaluations.of_job(session, job.id)
            best = evaluations.best_checkpoint(job.spec, rows)
            checkpoint = {
                "source": str(run_dir / runs.CHECKPOINTS / f"{runs.CHECKPOINT_PREFIX}{export.step}"),
                "checkpoint": str(export.step),
                "evaluation": evaluations.checkpoint_metrics(rows).get(export.step, {}),
                "best_by": best.metric if best is not None and best.step == export.step else None,
            }
    return {
        **checkpoint,
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


def make_side_dir(export_dir: Path) -> None:
    """`<run dir>/<exports or evaluations>/<id>/`, the folder of a run of the job's own (an export, an
    evaluation), readable by the run user's group where the run directory is theirs."""
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


def sweep(launcher_for: LauncherFor) -> None:
    """Settle launched exports. The caller holds the reconcile singleton (`worker.controller.reconcile`),
    and starts queued ones with the jobs (`worker.controller.schedule`)."""
    lifecycle.sweep(_views(list(LAUNCHED)), launcher_for, _reconcile_one, "export")


def cancel_requested(job_id: str, launcher_for: LauncherFor) -> None:
    """Cancel this job's `cancelling` exports now
    (the `ftq.exports` task: `worker.controller.exports_changed`)."""
    for v in _views([JobStatus.cancelling], job_id):
        cancel(v.id, launcher_for)


def _reconcile_one(v: ExportView, launcher: Launcher, state: RunState | None) -> None:
    lifecycle.reconcile_one(EXPORTS, v, launcher, state)


class ExportKind:
    """What `worker.lifecycle` needs of an export: its row in `ftq.store.exports` (with its job's, whose
    launcher, owner and priority it takes), its folder and request; no retries, time limit or metrics of
    its own."""

    name = scheduling.EXPORT
    run_noun = "export"
    transitions = store.EXPORTS

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

    def queued(self, session: Session) -> list[scheduling.RunRequest]:
        return [_run_request(r) for r in store.queued_for_scheduling(session)]

    def holding(self, session: Session) -> list[scheduling.Running]:
        held = store.holding_devices(session)
        return [scheduling.Running.of(r, estimate_seconds=ESTIMATE_SECONDS) for r in held]

    def prepare(self, session: Session, v: ExportView) -> bool:
        try:
            make_side_dir(v.run_dir)
        except OSError as exc:
            # No run directory (removed by hand, or a data dir restored without it): nothing to export.
            why = f"the job's run directory cannot hold the export: {exc}"[:2000]
            lifecycle.End(JobStatus.failed, ErrorCode.launch_error, why).record(session, store.EXPORTS, v.id)
            return False
        return True

    def request(self, row: tuple[Export, Job], v: ExportView) -> LaunchRequest:
        return write_export_dir(*row, v.run_dir)

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

    def held(self, session: Session, row: tuple[Export, Job], v: ExportView, state: RunState) -> bool:
        return False  # exports are not paused


EXPORTS = ExportKind()
