"""The evaluation controller: the third kind of run the one scheduler places (after jobs and exports).
An evaluation is `python -m trainer.evaluate` launched into `<run dir>/evaluations/<evaluation id>/`
(launch.sh locally, job.sbatch on SLURM) through the job's launcher, one process on its job's device, and
driven through `worker.lifecycle` as an export is (`worker.exports`): same quotas, fair share,
reservations, queue reasons and compare-and-set transitions (`ftq.store.evaluations.EVALUATIONS`).

What is an evaluation's own:
- `queue_due`: each sweep queues the evaluations the spec's `eval.on` asks for: one per complete checkpoint
  (`on: checkpoint`), and one of final/ once the job succeeded (either `on`);
- `before_end`: its results.json becomes the row's metrics before its end is recorded (the end is a
  job.evaluation event, with the job's best checkpoint then);
- `rotate`: with evaluated checkpoints the trainer does not rotate (trainer.train leaves
  save_total_limit to the worker); here a checkpoint is removed only once it is scored, it is not the best
  one, and `save_total_limit` newer ones are kept.
"""

from __future__ import annotations

import json
import logging
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select

from ftq.contract import runs
from ftq.contract.evaluation import EVALUATION_REQUEST, EVALUATIONS, RESULTS
from ftq.contract.status import LAUNCHED, TERMINAL, JobStatus
from ftq.runtime.settings import get_settings
from ftq.store import evaluations as store
from ftq.store.db import session_scope
from ftq.store.models import Evaluation, Job
from worker import scheduling
from worker.lifecycle import LauncherFor
from worker.side_runs import SideRunKind, SideRunView

log = logging.getLogger(__name__)
# A succeeded job is looked at for its final evaluation and its checkpoints this long after it ended.
DUE_WINDOW = timedelta(days=1)


def evaluation_dir(run_dir: Path, evaluation_id: str) -> Path:
    return run_dir / EVALUATIONS / evaluation_id


# What the spec's eval.on asks for ---------------------------------------------------------------------


def _wants(spec: dict[str, Any] | None) -> tuple[bool, bool]:
    """(evaluate checkpoints, evaluate final/) for a job's spec."""
    ev = (spec or {}).get("eval") or {}
    if not ev.get("suites"):
        return False, False
    return ev.get("on") == "checkpoint", True


def queue_due(now: datetime | None = None) -> int:
    """Queue the evaluations the jobs' specs ask for and that are not queued yet; rotate what may go.
    Returns how many were queued."""
    now = now or datetime.now(UTC)
    runs_dir = get_settings().runs_dir
    queued = 0
    with session_scope() as session:
        stmt = select(Job).where(
            (Job.status.in_([str(s) for s in LAUNCHED]))
            | ((Job.status == JobStatus.succeeded) & (Job.finished_at >= now - DUE_WINDOW))
        )
        for job in session.scalars(stmt):
            checkpoints, final = _wants(job.spec)
            if not (checkpoints or final):
                continue
            have = store.of_job(session, job.id)
            auto = {(e.trigger, e.step) for e in have if e.trigger != store.TRIGGER_REQUEST}
            run_dir = runs.run_dir(runs_dir, job.id)
            if checkpoints:
                for c in runs.list_checkpoints(run_dir):
                    if c.resumable and (store.TRIGGER_CHECKPOINT, c.step) not in auto:
                        store.add_evaluation(
                            session, job.id, step=c.step, suites=None, trigger=store.TRIGGER_CHECKPOINT
                        )
                        queued += 1
            final_due = final and job.status == JobStatus.succeeded
            if final_due and (store.TRIGGER_FINAL, None) not in auto and (run_dir / runs.FINAL).is_dir():
                store.add_evaluation(session, job.id, step=None, suites=None, trigger=store.TRIGGER_FINAL)
                queued += 1
            if checkpoints:
                rotate(job, run_dir, store.of_job(session, job.id))
        session.commit()
    return queued


def keep(spec: dict[str, Any] | None, steps: list[int], evaluations: list[Evaluation]) -> set[int]:
    """The checkpoints rotation keeps: the newest `save_total_limit`, the best one, and every one not
    scored yet (an evaluation of it queued or running, or none yet). All of them without a limit."""
    limit = ((spec or {}).get("training") or {}).get("save_total_limit")
    if not limit:
        return set(steps)
    kept = set(sorted(steps)[-int(limit) :])
    done = {e.step for e in evaluations if e.status in TERMINAL and e.trigger == store.TRIGGER_CHECKPOINT}
    kept |= {s for s in steps if s not in done}
    best = store.best_checkpoint(spec, evaluations)
    if best is not None:
        kept.add(best.step)
    return kept


def rotate(job: Job, run_dir: Path, evaluations: list[Evaluation]) -> list[int]:
    """Remove the checkpoints `keep` lets go; returns their steps."""
    found = {c.step: c.path for c in runs.list_checkpoints(run_dir) if c.resumable}
    kept = keep(job.spec, list(found), evaluations)
    removed = []
    for step, path in found.items():
        if step not in kept and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(step)
            log.info("job %s: checkpoint-%s removed (scored, not the best, past the limit)", job.id, step)
    return removed


def read_results(folder: Path) -> dict[str, float] | None:
    try:
        data = json.loads(runs.read_run_file(folder / RESULTS, 16 * 1024 * 1024))
    except (OSError, ValueError):
        return None
    metrics = data.get("metrics") if isinstance(data, dict) else None
    if not isinstance(metrics, dict):
        return None
    return {
        str(k): float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


class EvaluationKind(SideRunKind):
    """An evaluation as `worker.lifecycle` drives it (as `worker.exports.ExportKind` an export), with what
    is its own: the due ones queued after each sweep, its results stored before its end is recorded."""

    name = scheduling.EVALUATION
    run_noun = "evaluation"
    transitions = store.EVALUATIONS
    table = Evaluation
    folder = EVALUATIONS
    module = "trainer.evaluate"
    request_file = EVALUATION_REQUEST

    def request_of(self, ev: Evaluation, job: Job, run_dir: Path) -> dict[str, Any]:
        """evaluation.json: everything `trainer.evaluate` needs (paths the server chose, never a client)."""
        plan_command = (job.plan or {}).get("command") or []
        return {
            "evaluation_id": ev.id,
            "job_id": job.id,
            "run_dir": str(run_dir),
            "out_dir": str(evaluation_dir(run_dir, ev.id)),
            "step": ev.step,
            "suites": ev.suites or [],
            "trust_remote_code": "--trust_remote_code" in plan_command,
        }

    def sweep(self, launcher_for: LauncherFor) -> None:
        """Settle launched evaluations, then queue the due ones and rotate scored checkpoints. The caller
        holds the reconcile singleton (`worker.controller.reconcile`)."""
        super().sweep(launcher_for)
        queue_due()

    def before_end(self, v: SideRunView) -> None:
        metrics = read_results(v.run_dir)
        if metrics is None:
            return
        with session_scope() as session:
            store.store_metrics(session, v.id, metrics)
            session.commit()


EVALUATIONS_KIND = EvaluationKind()
sweep = EVALUATIONS_KIND.sweep
cancel_requested = EVALUATIONS_KIND.cancel_requested
