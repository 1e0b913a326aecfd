"""What every kind of side run shares in the worker: a run of a job's that is not its training (an
export, an evaluation), launched through its job's launcher into `<run dir>/<folder>/<id>/` as one
process on its job's device, placed by the one scheduler (`worker.scheduling.decide`) with the jobs and
driven through `worker.lifecycle` with its table's transitions (`ftq.store.transitions.RunTable`).

`SideRunKind` is the `worker.lifecycle.Kind` of such a run: a kind (`worker.exports.ExportKind`,
`worker.evaluations.EvaluationKind`) names its table, folder and transitions, writes its folder's files
(`request`), and overrides only the hooks it has (an evaluation's `before_end`); no retries, time limit,
pause or metrics of its own.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.errors import ErrorCode
from ftq.contract.spec import JobSpec
from ftq.contract.status import LAUNCHED, JobStatus
from ftq.planning.render import render_export_plan
from ftq.runtime.settings import get_settings
from ftq.store import repository, side_runs
from ftq.store.db import session_scope
from ftq.store.models import Job
from ftq.store.transitions import RunTable
from worker import lifecycle, scheduling
from worker.failures import Failure
from worker.launchers.base import Launcher, LaunchRequest, RunState
from worker.lifecycle import LauncherFor, RunView

# A side run loads the model and writes it out (or scores it): minutes, whatever the training took. What
# the scheduler expects it to hold its slot for, so a reservation behind it can be told; it has no time
# limit of its own, so it backfills only onto devices a reservation leaves spare.
ESTIMATE_SECONDS = 600.0


@dataclass(frozen=True)
class SideRunView(RunView):
    """A side run's row as a sweep needs it (`run_dir`: its folder, `<run dir>/<folder>/<id>/`)."""

    job_id: str


def make_side_dir(folder: Path) -> None:
    """`<run dir>/<exports or evaluations>/<id>/`, the folder of a run of the job's own (an export, an
    evaluation), readable by the run user's group where the run directory is theirs."""
    parent, run_dir = folder.parent, folder.parent.parent
    parent.mkdir(mode=0o700, exist_ok=True)
    info = run_dir.stat()
    if info.st_gid != os.getegid() and os.geteuid() == 0:
        # A run user's run directory (worker.launchers.local.share_run_dir): its group enters the parent.
        os.chown(parent, -1, info.st_gid)
        parent.chmod(0o750)
    folder.mkdir(mode=0o700, exist_ok=True)


class SideRunKind(ABC):
    """What `worker.lifecycle` needs of a side run: its row in `table` (with its job's, whose launcher,
    owner and priority it takes), its folder (`folder` under the run directory) and its request."""

    name: str  # its `worker.scheduling` kind
    run_noun: str
    transitions: RunTable
    table: ClassVar[side_runs.SideRun]
    folder: ClassVar[str]
    module: ClassVar[str]  # what it launches: `python -m <module>`
    request_file: ClassVar[str]  # the request file it reads in its folder

    # Its folder and what it runs ---------------------------------------------------------------------

    def folder_of(self, job_id: str, row_id: str) -> Path:
        return runs.run_dir(get_settings().runs_dir, job_id) / self.folder / row_id

    def view(self, row: Any, job: Job) -> SideRunView:
        run_dir = self.folder_of(row.job_id, row.id)
        return SideRunView.of(row, launcher=job.launcher, run_dir=run_dir, job_id=row.job_id)

    def views(self, statuses: list[str], job_id: str | None = None) -> list[SideRunView]:
        with session_scope() as session:
            out = []
            for row in side_runs.rows_in(session, self.table, statuses):
                if job_id is not None and row.job_id != job_id:
                    continue
                job = repository.get_job(session, row.job_id)
                if job is not None:
                    out.append(self.view(row, job))
            return out

    def run_request(self, row: Any, devices: int = 1) -> scheduling.RunRequest:
        """A queued row as the scheduler weighs it: one process on `devices` of its job's launcher and
        device (one unless the kind says otherwise: `devices_of`), its job's owner and priority, submitted
        when it was asked for."""
        pool = scheduling.pool_of(row.launcher, row.device)
        return scheduling.RunRequest(
            id=row.id,
            owner=row.owner,
            need=scheduling.Need(pool, max(1, devices) if pool else 0),
            priority=row.priority or "normal",
            seq=row.seq,
            estimate_seconds=ESTIMATE_SECONDS,
            kind=self.name,
            submitted=row.created_at.timestamp(),
        )

    # The worker's entry points -------------------------------------------------------------------------

    def sweep(self, launcher_for: LauncherFor) -> None:
        """Settle launched rows. The caller holds the reconcile singleton (`worker.controller.reconcile`),
        and starts queued ones with the jobs (`worker.controller.schedule`)."""
        lifecycle.sweep(self.views(list(LAUNCHED)), launcher_for, self.reconcile_one, self.run_noun)

    def cancel_requested(self, job_id: str, launcher_for: LauncherFor) -> None:
        """SIGTERM (or scancel) this job's `cancelling` rows now; the sweep escalates and records the end."""
        for v in self.views([JobStatus.cancelling], job_id):
            lifecycle.cancel(self, v.id, launcher_for)

    def reconcile_one(self, v: SideRunView, launcher: Launcher, state: RunState | None) -> None:
        lifecycle.reconcile_one(self, v, launcher, state)

    # worker.lifecycle.Kind -------------------------------------------------------------------------------

    def label(self, v: SideRunView) -> str:
        return f"{self.run_noun} {v.id} of job {v.job_id}"

    def job_id(self, v: SideRunView) -> str:
        return v.job_id

    def read(self, session: Session, row_id: str) -> tuple[tuple[Any, Job], SideRunView] | None:
        row = side_runs.get_row(session, self.table, row_id)
        job = repository.get_job(session, row.job_id) if row is not None else None
        if row is None or job is None:
            return None
        return (row, job), self.view(row, job)

    def queued(self, session: Session) -> list[scheduling.RunRequest]:
        rows = side_runs.queued_for_scheduling(session, self.table)
        return [self.run_request(r, self.devices_of(session, r)) for r in rows]

    def devices_of(self, session: Session, row: Any) -> int:
        """The devices (GPUs of one node, or CPU slots) a queued row of this kind takes: one."""
        return 1

    def devices_for(self, job: Job, spec: JobSpec) -> int:
        """The same for a row of `job` being launched (what its SLURM script asks for)."""
        return 1

    def holding(self, session: Session) -> list[scheduling.Running]:
        held = side_runs.holding_devices(session, self.table)
        return [scheduling.Running.of(r, estimate_seconds=ESTIMATE_SECONDS) for r in held]

    def prepare(self, session: Session, v: SideRunView) -> bool:
        try:
            make_side_dir(v.run_dir)
        except OSError as exc:
            # No run directory (removed by hand, or a data dir restored without it): nothing to run on.
            why = f"the job's run directory cannot hold the {self.run_noun}: {exc}"[:2000]
            lifecycle.End(JobStatus.failed, ErrorCode.launch_error, why).record(
                session, self.transitions, v.id
            )
            return False
        return True

    def request(self, row: tuple[Any, Job], v: SideRunView) -> LaunchRequest:
        return self.write_folder(*row, v.run_dir)

    @abstractmethod
    def request_of(self, row: Any, job: Job, run_dir: Path) -> dict[str, Any]:
        """The request file's contents: everything the module needs (paths the server chose)."""

    def env_of(self, row: Any) -> dict[str, str]:
        """What the run's process gets in its environment besides the launcher's."""
        return {}

    def write_folder(self, row: Any, job: Job, folder: Path) -> LaunchRequest:
        """Write this attempt's request file and launch script into the row's folder; what to launch."""
        spec = JobSpec.model_validate(job.spec)
        devices = self.devices_for(job, spec)
        plan = render_export_plan(
            spec,
            export_id=row.id,
            export_dir=folder,
            settings=get_settings(),
            module=self.module,
            request=self.request_file,
            devices=devices,
        )
        with session_scope() as session:  # its usage at its end counts these (SLURM's as asked for)
            side_runs.record_devices(session, self.table, row.id, devices)
            session.commit()
        files = {
            self.request_file: json.dumps(self.request_of(row, job, folder.parent.parent), indent=2) + "\n",
            runs.LAUNCH_SCRIPT: plan.launch_script,
        }
        lifecycle.write_attempt_files(folder, files)
        return LaunchRequest(
            job_id=row.id,
            run_dir=folder,
            spec=spec,
            plan=plan,
            resources=row.resources or {},
            env=self.env_of(row),
            owner=job.owner,
        )

    def while_running(self, v: SideRunView, launcher: Launcher, state: RunState) -> None:
        return None

    def before_end(self, v: SideRunView) -> None:
        return None

    def stopped_by_worker(self, v: SideRunView) -> Failure | None:
        return None

    def retried(self, session: Session, row: tuple[Any, Job], v: SideRunView, failure: Failure) -> bool:
        return False

    def after_cancelled(self, row: tuple[Any, Job], v: SideRunView) -> None:
        return None

    def held(self, session: Session, row: tuple[Any, Job], v: SideRunView, state: RunState) -> bool:
        return False  # side runs are not paused
