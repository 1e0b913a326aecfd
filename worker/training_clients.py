"""Tinker training clients in the worker (issue 52): a LoRA training client is a run the one scheduler
places like a job's (`worker.scheduling.decide`: its devices, the owner's quotas, fair share), launched
through the same launchers (a local process group, or a SLURM batch job) as `python -m
trainer.tinker_host <folder>` and driven through `worker.lifecycle` with its table's transitions
(`ftq.store.training_clients.TRAINING_CLIENTS`), the way a serving engine is (`worker.deployments`).

The API asks for one (a queued row) on `create_model`, reads where its host answers (`endpoint.json`)
and relays each call to it. When no call has used one for FTQ_TINKER_IDLE_SECONDS the API saves its
state (weights, optimizer, pending gradients) and marks it saved idle (`idle_state`): the worker then
stops its run and records the row `paused`, its devices back and that run's devices x time in the
owner's usage (`held`); the client's next call queues a new run of the row that loads the state. One
whose API is gone (no save) is stopped after twice the idle time plus 60 s, as a serving engine is. Each
run's end counts its devices x the time it held them in the owner's usage."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.errors import ErrorCode
from ftq.contract.runs import ENDPOINT
from ftq.contract.status import LAUNCHED, JobStatus
from ftq.contract.tinker import HOST_MODULE, KEY, REQUEST, client_folder
from ftq.planning.render import ENGINE_MODULE, EXPORT_LAUNCHER, launch_script, render_engine_plan
from ftq.runtime import logs
from ftq.runtime.settings import Settings, get_settings
from ftq.store import training_clients
from ftq.store.db import session_scope
from ftq.store.models import TrainingClient
from worker import lifecycle, scheduling
from worker.failures import Failure
from worker.launchers.base import Launcher, LaunchRequest, RunState
from worker.launchers.local import run_user
from worker.lifecycle import LauncherFor, RunView

log = logging.getLogger(__name__)

# What the scheduler expects a training client to hold its devices for: it has no time limit and ends
# when its session stops or it is idle, so it only backfills onto devices a reservation leaves spare.
ESTIMATE_SECONDS = 3600.0


def backstop_seconds(settings: Settings) -> float:
    """A training client no call has used for this long is stopped by the worker without a save: the API
    that saves idle ones (after FTQ_TINKER_IDLE_SECONDS) is gone."""
    return 2 * settings.tinker_idle_seconds + 60


@dataclass(frozen=True)
class TrainingClientView(RunView):
    owner: str
    last_used_at: datetime
    idle_saved: bool = False  # its state was saved idle: its run is to stop, the row to wait paused


def folder_of(settings: Settings, row: TrainingClient) -> Path:
    """`<data dir>/tinker/clients/tc_<seq>/`: the host's request, key, endpoint and log."""
    return client_folder(settings.state_path("tinker"), row.seq)


def _folder(row: TrainingClient) -> Path:
    return folder_of(get_settings(), row)


class TrainingClientKind:
    """`worker.lifecycle.Kind` of a training client (see the module's docstring)."""

    name = scheduling.TRAINING_CLIENT
    run_noun = "training client"
    transitions = training_clients.TRAINING_CLIENTS

    def view(self, row: TrainingClient) -> TrainingClientView:
        return TrainingClientView.of(
            row, launcher=row.launcher, run_dir=_folder(row), owner=row.owner, last_used_at=row.last_used_at,
            idle_saved=row.idle_state is not None,
        )  # fmt: skip

    def views(self, statuses: list[str]) -> list[TrainingClientView]:
        with session_scope() as session:
            return [self.view(r) for r in training_clients.rows_in(session, statuses)]

    # The worker's entry points -------------------------------------------------------------------------

    def sweep(self, launcher_for: LauncherFor) -> None:
        """Settle launched training clients, and stop the ones no call has used for long."""
        self.stop_idle(launcher_for)
        lifecycle.sweep(self.views(list(LAUNCHED)), launcher_for, self.reconcile_one, self.run_noun)

    def cancel_requested(self, launcher_for: LauncherFor) -> None:
        """SIGTERM (or scancel) the `cancelling` ones now, and those saved idle; the sweep escalates and
        records the end (cancelled, or paused for the ones saved idle)."""
        for v in self.views([JobStatus.cancelling]):
            lifecycle.cancel(self, v.id, launcher_for)
        for v in self.views([JobStatus.running]):
            if v.idle_saved and v.launched:
                with logs.job_context(v.id):
                    launcher_for(v.launcher).cancel(v.ref())

    def stop_idle(self, launcher_for: LauncherFor) -> None:
        before = datetime.now(UTC) - timedelta(seconds=backstop_seconds(get_settings()))
        with session_scope() as session:
            stale = training_clients.unused_since(session, before)
            for row_id in stale:
                if training_clients.TRAINING_CLIENTS.request_cancel(session, row_id):
                    log.info("training client %s: unused since %s; stopping it", row_id, before.isoformat())
            session.commit()
        for row_id in stale:
            lifecycle.cancel(self, row_id, launcher_for)

    def reconcile_one(self, v: TrainingClientView, launcher: Launcher, state: RunState | None) -> None:
        lifecycle.reconcile_one(self, v, launcher, state)

    # worker.lifecycle.Kind -------------------------------------------------------------------------------

    def label(self, v: TrainingClientView) -> str:
        return f"training client {v.id} of {v.owner}"

    def job_id(self, v: TrainingClientView) -> str:
        return v.id

    def read(self, session: Session, row_id: str) -> tuple[TrainingClient, TrainingClientView] | None:
        row = training_clients.get_training_client(session, row_id)
        return (row, self.view(row)) if row is not None else None

    def queued(self, session: Session) -> list[scheduling.RunRequest]:
        out = []
        for row in training_clients.queued_for_scheduling(session):
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
        held = training_clients.holding_devices(session)
        return [scheduling.Running.of(r, estimate_seconds=ESTIMATE_SECONDS) for r in held]

    def prepare(self, session: Session, v: TrainingClientView) -> bool:
        try:
            parent = v.run_dir.parent
            parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if run_user(get_settings(), v.owner) is not None:
                parent.chmod(0o711)  # run users pass through to their own host's folder, never list
            v.run_dir.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            why = f"the training client's folder cannot be made: {exc}"[:2000]
            lifecycle.End(JobStatus.failed, ErrorCode.launch_error, why).record(
                session, self.transitions, v.id
            )
            return False
        return True

    def request(self, row: TrainingClient, v: TrainingClientView) -> LaunchRequest:
        settings = get_settings()
        folder = v.run_dir
        bind = "127.0.0.1" if row.launcher == "local" else "0.0.0.0"
        plan = render_engine_plan(
            f"tc_{row.seq}",
            folder=folder,
            settings=settings,
            launcher=row.launcher,
            device=row.device,
            devices=row.devices,
        )
        # The engine's launch (one process, its devices, SLURM's one-task job) with the host's module:
        # the same shape, another program.
        argv = [settings.python, "-m", HOST_MODULE, str(folder)]
        sbatch = plan.sbatch_script.replace(ENGINE_MODULE, HOST_MODULE) if plan.sbatch_script else None
        plan = plan.model_copy(
            update={
                "command": argv,
                "sbatch_script": sbatch,
                "trainer_args": {"tinker_host": str(folder)},
                "launch_script": launch_script(folder, [*EXPORT_LAUNCHER, *argv]),
            }
        )
        request = {
            "model_id": row.id,
            "config": row.config,
            "host": bind,
            "device": row.device,
        }
        files = {
            REQUEST: json.dumps(request, indent=2) + "\n",
            KEY: row.api_key + "\n",
            runs.LAUNCH_SCRIPT: plan.launch_script,
        }
        if plan.sbatch_script is not None:
            files[runs.SBATCH_SCRIPT] = plan.sbatch_script
        (folder / ENDPOINT).unlink(missing_ok=True)
        lifecycle.write_attempt_files(folder, files)
        user = run_user(settings, row.owner)
        if user is not None:
            for name in (REQUEST, KEY):
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

    def while_running(self, v: TrainingClientView, launcher: Launcher, state: RunState) -> None:
        if v.idle_saved and v.status == JobStatus.running:
            launcher.cancel(v.ref())  # its state is saved: the run stops, the row waits paused (`held`)

    def before_end(self, v: TrainingClientView) -> None:
        (v.run_dir / ENDPOINT).unlink(missing_ok=True)

    def stopped_by_worker(self, v: TrainingClientView) -> Failure | None:
        return None

    def retried(self, session: Session, row: TrainingClient, v: TrainingClientView, failure: Failure) -> bool:
        return False

    def after_cancelled(self, row: TrainingClient, v: TrainingClientView) -> None:
        return None

    def held(self, session: Session, row: TrainingClient, v: TrainingClientView, state: RunState) -> bool:
        if row.idle_state is None:
            return False
        if not training_clients.mark_paused_idle(session, row.id, run_ended=lifecycle.utc(state.ended_at)):
            return False
        for stale in runs.ATTEMPT_RECORDS:  # the next run is a new launch, never this one adopted again
            (v.run_dir / stale).unlink(missing_ok=True)
        log.info("training client %s: saved idle in %s; its run ended, it waits", row.id, row.idle_state)
        return True


TRAINING_CLIENTS_KIND = TrainingClientKind()
