"""Every SQL statement about evaluations (the third kind of run, after jobs and exports).

`EvaluationRepository(session, owner)` is what the API uses: every read goes through `_readable()`, which
joins the evaluation's job and filters on its owner. The module-level functions are the worker's; an
evaluation's transitions are `EVALUATIONS`, the one compare-and-set mechanism of every kind of run
(`ftq.store.transitions.RunTable`) on this table. Its end counts in its owner's usage as an export's does,
and is a `job.evaluation` event (with the metrics and the job's best checkpoint then).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Select, false, func, select, update
from sqlalchemy.orm import Session

from ftq.contract.evaluation import Best, Scored, best_of, ref_label
from ftq.contract.events import EventType
from ftq.contract.status import JobStatus
from ftq.store import events
from ftq.store.db import lock_for_transaction
from ftq.store.exports import account_side_run, holding_devices, queued_for_scheduling
from ftq.store.models import Dispatch, Evaluation, EvaluationQueue, Job
from ftq.store.transitions import RunTable, utcnow

# The outbox's dispatch kind that wakes the worker's evaluation sweep (`ftq.runtime.queue.TASK_EVALUATIONS`).
DISPATCH_KIND = "evaluation"
TRIGGER_CHECKPOINT, TRIGGER_FINAL, TRIGGER_REQUEST = "checkpoint", "final", "request"


def new_evaluation_id() -> str:
    return "eval_" + secrets.token_hex(8)


class EvaluationRepository:
    def __init__(self, session: Session, owner: str):
        self.session = session
        self.owner = owner

    def _readable(self) -> Select[Any]:
        return select(Evaluation).join(Job, Job.id == Evaluation.job_id).where(Job.owner == self.owner)

    def get(self, job_id: str, evaluation_id: str) -> Evaluation | None:
        stmt = self._readable().where(Evaluation.job_id == job_id, Evaluation.id == evaluation_id)
        return self.session.scalars(stmt).first()

    def list_for(self, job_id: str) -> list[Evaluation]:
        """The job's evaluations, newest first."""
        stmt = self._readable().where(Evaluation.job_id == job_id).order_by(Evaluation.seq.desc())
        return list(self.session.scalars(stmt))

    def queue_of(self, ids: Sequence[str]) -> dict[str, EvaluationQueue]:
        if not ids:
            return {}
        stmt = (
            select(EvaluationQueue)
            .join(Evaluation, Evaluation.id == EvaluationQueue.evaluation_id)
            .join(Job, Job.id == Evaluation.job_id)
            .where(Job.owner == self.owner, EvaluationQueue.evaluation_id.in_(list(ids)))
        )
        return {row.evaluation_id: row for row in self.session.scalars(stmt)}

    def queued_requests(self) -> int:
        """This owner's evaluations asked for on demand that wait for a device (queued), over all its jobs,
        with the owner's queue held until the transaction ends (two requests cannot both pass the cap)."""
        if not lock_for_transaction(self.session, f"evaluation-queue:{self.owner}"):
            self.session.execute(update(Evaluation).where(false()).values(trigger=Evaluation.trigger))
        stmt = (
            self._readable()
            .where(Evaluation.status == JobStatus.queued, Evaluation.trigger == TRIGGER_REQUEST)
            .with_only_columns(func.count())
        )
        return int(self.session.scalar(stmt) or 0)

    def add(self, job_id: str, *, step: int | None, suites: list[str] | None, trigger: str) -> Evaluation:
        """A queued evaluation and the dispatch that wakes the worker, in the caller's transaction."""
        return add_evaluation(self.session, job_id, step=step, suites=suites, trigger=trigger)


# System operations (the worker, for every owner) -----------------------------------------------------


def add_evaluation(
    session: Session, job_id: str, *, step: int | None, suites: list[str] | None, trigger: str
) -> Evaluation:
    now = utcnow()
    ev = Evaluation(
        id=new_evaluation_id(),
        job_id=job_id,
        step=step,
        suites=suites,
        trigger=trigger,
        status=JobStatus.queued,
        created_at=now,
        updated_at=now,
    )
    session.add(ev)
    session.flush()
    session.add(Dispatch(job_id=job_id, kind=DISPATCH_KIND, created_at=now, attempts=0))
    session.flush()
    return ev


def get_evaluation(session: Session, evaluation_id: str) -> Evaluation | None:
    return session.scalars(select(Evaluation).where(Evaluation.id == evaluation_id)).first()


def evaluations_in(session: Session, statuses: Sequence[str]) -> list[Evaluation]:
    stmt = select(Evaluation).where(Evaluation.status.in_([str(s) for s in statuses]))
    return list(session.scalars(stmt.order_by(Evaluation.seq)))


def of_job(session: Session, job_id: str) -> list[Evaluation]:
    stmt = select(Evaluation).where(Evaluation.job_id == job_id).order_by(Evaluation.seq)
    return list(session.scalars(stmt))


def queued_rows(session: Session) -> list[Any]:
    return queued_for_scheduling(session, Evaluation)


def holding_rows(session: Session) -> list[Any]:
    return holding_devices(session, Evaluation)


def store_metrics(session: Session, evaluation_id: str, metrics: dict[str, float]) -> None:
    session.execute(update(Evaluation).where(Evaluation.id == evaluation_id).values(metrics=metrics))


# Scores and the best checkpoint ----------------------------------------------------------------------


def checkpoint_metrics(rows: Sequence[Evaluation]) -> dict[int | None, dict[str, float]]:
    """Each checkpoint's metrics (None: final/): the succeeded evaluations' metrics merged, newer ones
    over older ones for the same name."""
    out: dict[int | None, dict[str, float]] = {}
    for ev in sorted(rows, key=lambda e: e.seq):
        if ev.status == JobStatus.succeeded and ev.metrics:
            out.setdefault(ev.step, {}).update(ev.metrics)
    return out


def best_checkpoint(spec: dict[str, Any] | None, rows: Sequence[Evaluation]) -> Best | None:
    """The job's best checkpoint by its spec's `eval.select`, from its evaluations (None without one)."""
    select_ = ((spec or {}).get("eval") or {}).get("select")
    if not select_:
        return None
    scored = [Scored(step, m) for step, m in checkpoint_metrics(rows).items()]
    return best_of(scored, str(select_["metric"]), str(select_.get("mode", "max")))


def best_of_jobs(session: Session, jobs: Sequence[Job]) -> dict[str, Best]:
    """The best checkpoint of each of these jobs that selects one (one query for them all)."""
    selecting = {j.id: j for j in jobs if ((j.spec or {}).get("eval") or {}).get("select")}
    if not selecting:
        return {}
    rows = session.scalars(
        select(Evaluation).where(
            Evaluation.job_id.in_(list(selecting)), Evaluation.status == JobStatus.succeeded
        )
    )
    by_job: dict[str, list[Evaluation]] = {}
    for ev in rows:
        by_job.setdefault(ev.job_id, []).append(ev)
    out = {}
    for job_id, evs in by_job.items():
        best = best_checkpoint(selecting[job_id].spec, evs)
        if best is not None:
            out[job_id] = best
    return out


def _ended(
    session: Session, row_id: str, *, run_started: datetime | None = None, run_ended: datetime | None = None
) -> None:
    """EVALUATIONS' `on_ended`: counted in its owner's usage, and a job.evaluation event (with webhooks)
    saying what was scored and which checkpoint is the best now."""
    account_side_run(session, row_id, run_started=run_started, run_ended=run_ended, table=Evaluation)
    ev = get_evaluation(session, row_id)
    if ev is None:
        return
    session.refresh(ev)  # the status just written by an UPDATE this session did not track
    job = session.scalars(select(Job).where(Job.id == ev.job_id)).first()
    if job is None:
        return
    best = best_checkpoint(job.spec, of_job(session, job.id))
    data = {
        "evaluation_id": ev.id,
        "checkpoint": ref_label(ev.step),
        "step": ev.step,
        "status": ev.status,
        "metrics": ev.metrics or {},
        "job_status": job.status,
        "best_checkpoint": None
        if best is None
        else {"step": best.step, "metric": best.metric, "value": best.value},
    }
    events.record(session, job.id, EventType.evaluation, data, key=f"evaluation:{ev.id}", owner=job.owner)


EVALUATIONS = RunTable(Evaluation, cancel_dispatch=DISPATCH_KIND, on_ended=_ended)


def request_cancel(session: Session, ev: Evaluation) -> str | None:
    """The API's cancel of an evaluation: its dispatch is about the evaluation's job."""
    return EVALUATIONS.request_cancel(session, ev.id, job_id=ev.job_id)
