"""Deployments in the worker (issue 49): a serving engine is a run the one scheduler places like a job's
(`worker.scheduling.decide`: its devices, the owner's quotas, fair share), launched through the same
launchers (a local process group, or a SLURM batch job) and driven through `worker.lifecycle` with its
table's transitions (`ftq.store.deployments.DEPLOYMENTS`).

The API asks for one (a queued row) when a call finds no engine for its base, reads where it answers
(`endpoint.json`, written by `ftq.engine.serve`), loads adapters into it and stops it when it has been idle
for FTQ_SERVE_IDLE_SECONDS (a cancel). The worker stops one itself when no call has used it for well
past that (the API that used it is gone). Its end counts its devices x the time it held them in the
owner's usage."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.errors import ErrorCode
from ftq.contract.status import LAUNCHED, JobStatus
from ftq.engine import serve
from ftq.engine.local import default_venv
from ftq.planning.render import render_engine_plan
from ftq.runtime.settings import Settings, get_settings
from ftq.store import deployments
from ftq.store.db import session_scope
from ftq.store.models import Deployment
from worker import lifecycle, scheduling
from worker.failures import Failure
from worker.launchers.base import Launcher, LaunchRequest, RunState
from worker.launchers.local import run_user
from worker.lifecycle import LauncherFor, RunView

log = logging.getLogger(__name__)

# What the scheduler expects an engine to hold its devices for when it places a run behind it: it has no
# time limit and ends when it is idle, so it only backfills onto devices a reservation leaves spare.
ESTIMATE_SECONDS = 3600.0


@dataclass(frozen=True)
class DeploymentView(RunView):
    owner: str
    last_used_at: datetime


def folder_of(settings: Settings, deployment_id: str) -> Path:
    """`<data dir>/engines/<id>/`: the engine's request, key, endpoint and log."""
    return settings.state_path("engines") / deployment_id


class DeploymentKind:
    """`worker.lifecycle.Kind` of a deployment (see the module's docstring)."""

    name = scheduling.DEPLOYMENT
    run_noun = "deployment"
    transitions = deployments.DEPLOYMENTS

    def view(self, row: Deployment) -> DeploymentView:
        folder = folder_of(get_settings(), row.id)
        return DeploymentView.of(
            row, launcher=row.launcher, run_dir=folder, owner=row.owner, last_used_at=row.last_used_at
        )

    def views(self, statuses: list[str]) -> list[DeploymentView]:
        with session_scope() as session:
            return [self.view(r) for r in deployments.rows_in(session, statuses)]

    # The worker's entry points -------------------------------------------------------------------------

    def sweep(self, launcher_for: LauncherFor) -> None:
        """Settle launched deployments, and stop the ones no call has used for long (their API is gone)."""
        self.stop_abandoned(launcher_for)
        lifecycle.sweep(self.views(list(LAUNCHED)), launcher_for, self.reconcile_one, self.run_noun)

    def cancel_requested(self, launcher_for: LauncherFor) -> None:
        """SIGTERM (or scancel) the `cancelling` deployments now; the sweep escalates and records the end."""
        for v in self.views([JobStatus.cancelling]):
            lifecycle.cancel(self, v.id, launcher_for)

    def stop_abandoned(self, launcher_for: LauncherFor) -> None:
        settings = get_settings()
        before = datetime.now(UTC) - deployments.idle_backstop(settings.serve_idle_seconds)
        with session_scope() as session:
            stale = deployments.unused_since(session, before)
            for dep_id in stale:
                if deployments.DEPLOYMENTS.request_cancel(session, dep_id):
                    log.info("deployment %s: unused since before %s; stopping it", dep_id, before.isoformat())
            session.commit()
        for dep_id in stale:
            lifecycle.cancel(self, dep_id, launcher_for)

    def reconcile_one(self, v: DeploymentView, launcher: Launcher, state: RunState | None) -> None:
        lifecycle.reconcile_one(self, v, launcher, state)

    # worker.lifecycle.Kind -------------------------------------------------------------------------------

    def label(self, v: DeploymentView) -> str:
        return f"deployment {v.id} of {v.owner}"

    def job_id(self, v: DeploymentView) -> str:
        return v.id

    def read(self, session: Session, row_id: str) -> tuple[Deployment, DeploymentView] | None:
        row = deployments.get_deployment(session, row_id)
        return (row, self.view(row)) if row is not None else None

    def queued(self, session: Session) -> list[scheduling.RunRequest]:
        out = []
        for row in deployments.queued_for_scheduling(session):
            pool = scheduling.pool_of(row.launcher, row.device)
            out.append(
                scheduling.RunRequest(
                    id=row.id,
                    owner=row.owner,
                    need=scheduling.Need(pool, row.devices if pool else 0),
                    priority=row.priority or "normal",
                    seq=row.seq,
                    estimate_seconds=ESTIMATE_SECONDS,
                    kind=self.name,
                    submitted=row.created_at.timestamp(),
                )
            )
        return out

    def holding(self, session: Session) -> list[scheduling.Running]:
        held = deployments.holding_devices(session)
        return [scheduling.Running.of(r, estimate_seconds=ESTIMATE_SECONDS) for r in held]

    def prepare(self, session: Session, v: DeploymentView) -> bool:
        try:
            parent = v.run_dir.parent
            parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if run_user(get_settings(), v.owner) is not None:
                parent.chmod(0o711)  # run users pass through to their own engine's folder, never list
            v.run_dir.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            why = f"the engine's folder cannot be made: {exc}"[:2000]
            lifecycle.End(JobStatus.failed, ErrorCode.launch_error, why).record(
                session, self.transitions, v.id
            )
            return False
        return True

    def request(self, row: Deployment, v: DeploymentView) -> LaunchRequest:
        settings = get_settings()
        folder = v.run_dir
        bind = "127.0.0.1" if row.launcher == "local" else "0.0.0.0"
        request = {"config": row.config, "host": bind, "venv": str(default_venv())}
        plan = render_engine_plan(
            row.id,
            folder=folder,
            settings=settings,
            launcher=row.launcher,
            device=row.device,
            devices=row.devices,
        )
        files = {
            serve.REQUEST: json.dumps(request, indent=2) + "\n",
            serve.KEY: row.api_key + "\n",
            runs.LAUNCH_SCRIPT: plan.launch_script,
        }
        if plan.sbatch_script is not None:
            files[runs.SBATCH_SCRIPT] = plan.sbatch_script
        (folder / runs.ENDPOINT).unlink(missing_ok=True)
        lifecycle.write_attempt_files(folder, files)
        user = run_user(settings, row.owner)
        if user is not None:
            # The engine runs as the owner's run user: it reads its request and key through their group.
            for name in (serve.REQUEST, serve.KEY):
                os.chown(folder / name, -1, user.gid)
                (folder / name).chmod(0o640)
        return LaunchRequest(
            job_id=row.id,
            run_dir=folder,
            spec=None,
            plan=plan,
            resources=row.resources or {},
            owner=row.owner,
            device=row.device,
        )

    def while_running(self, v: DeploymentView, launcher: Launcher, state: RunState) -> None:
        return None

    def before_end(self, v: DeploymentView) -> None:
        (v.run_dir / runs.ENDPOINT).unlink(missing_ok=True)

    def stopped_by_worker(self, v: DeploymentView) -> Failure | None:
        return None

    def retried(self, session: Session, row: Deployment, v: DeploymentView, failure: Failure) -> bool:
        return False  # the next call asks for another

    def after_cancelled(self, row: Deployment, v: DeploymentView) -> None:
        return None

    def held(self, session: Session, row: Deployment, v: DeploymentView, state: RunState) -> bool:
        return False


DEPLOYMENTS_KIND = DeploymentKind()
