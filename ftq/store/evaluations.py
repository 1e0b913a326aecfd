"""Every SQL statement about evaluations (the third kind of run, after jobs and exports).

`EvaluationRepository(session, owner)` is what the API uses, its reads filtered on the owner by
`ftq.store.side_runs.SideRunRepository._readable` (what every side run shares is there). The
module-level functions are the worker's; an evaluation's transitions are `EVALUATIONS`, the one
compare-and-set mechanism of every kind of run (`ftq.store.transitions.RunTable`) on this table. Its end
counts in its owner's usage as an export's does, and is a `job.evaluation` event (with the metrics and the
job's best checkpoint then).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ftq.contract.evaluation import Best, Scored, best_of, ref_label
from ftq.contract.events import EventType
from ftq.contract.status import JobStatus
from ftq.store import events
from ftq.store.models import Evaluation, EvaluationQueue, Job
from ftq.store.side_runs import SideRunRepository, account_side_run, add_queued, get_row
from ftq.store.transitions import RunTable

# The outbox's dispatch kind that wakes the worker's evaluation sweep (`ftq.runtime.queue.TASK_EVALUATIONS`).
DISPATCH_KIND = "evaluation"
TRIGGER_CHECKPOINT, TRIGGER_FINAL, TRIGGER_REQUEST = "checkpoint", "final", "request"


def new_evaluation_id() -> str:
    return "eval_" + secrets.token_hex(8)


# System operations (the worker, for every owner) -----------------------------------------------------


def add_evaluation(
    session: Session, job_id: str, *, step: int | None, suites: list[str] | None, trigger: str
) -> Evaluation:
    fields = {"step": step, "suites": suites, "trigger": trigger}
    ev: Evaluation = add_queued(session, Evaluation, new_evaluation_id(), job_id, DISPATCH_KIND, **fields)
    return ev


def get_evaluation(session: Session, evaluation_id: str) -> Evaluation | None:
    ev: Evaluation | None = get_row(session, Evaluation, evaluation_id)
    return ev


def of_job(session: Session, job_id: str) -> list[Evaluation]:
    stmt = select(Evaluation).where(Evaluation.job_id == job_id).order_by(Evaluation.seq)
    return list(session.scalars(stmt))


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


class EvaluationRepository(
    SideRunRepository[Evaluation, EvaluationQueue],
    queue=EvaluationQueue,
    noun="evaluation",
    transitions=EVALUATIONS,
):
    def queued_requests(self) -> int:
        """This owner's evaluations asked for on demand that wait for a device (queued), over all its jobs,
        with the owner's queue held until the transaction ends (two requests cannot both pass the cap)."""
        self.hold_queue()
        return self.queued_count(Evaluation.trigger == TRIGGER_REQUEST)

    def add(self, job_id: str, *, step: int | None, suites: list[str] | None, trigger: str) -> Evaluation:
        """A queued evaluation and the dispatch that wakes the worker, in the caller's transaction."""
        return add_evaluation(self.session, job_id, step=step, suites=suites, trigger=trigger)
