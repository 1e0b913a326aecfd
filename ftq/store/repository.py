"""Every SQL statement about jobs, their points, idempotency keys and dispatches.

`JobRepository(session, owner)` is what the API uses: every read goes through `_readable()`, the one
place the owner filter is applied, so a new query cannot forget it. The module-level functions below
it are the system's own operations (worker, relay, ingest). A job's state changes are `JOBS`, the
compare-and-set transitions every kind of run shares (`ftq.store.transitions.RunTable`) with the job's
events and the accounting of its end as hooks, so a task delivered twice changes nothing the second time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    JSON,
    Engine,
    Integer,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, defer

from ftq.contract.events import EventType
from ftq.contract.metrics import POINT_FIELDS
from ftq.contract.status import ACTIVE, LAUNCHED, TERMINAL, JobStatus
from ftq.store import events
from ftq.store.db import AsyncReadPool
from ftq.store.models import (
    DeploymentQueue,
    Dispatch,
    EvaluationQueue,
    ExportQueue,
    IdempotencyKey,
    Job,
    JobQueue,
    MetricPoint,
    OwnerUsage,
    Sample,
)
from ftq.store.owned import OwnedRepository
from ftq.store.transitions import RunTable, rowcount, utcnow

# The metrics poll, built once: building a statement and matching its result columns to the cached
# compiled form costs more CPU than PostgreSQL spends answering it. One round trip: the owner-filtered
# jobs row (as _readable() filters every other read) joined to the page of points, so a job without new
# points still gives its status, and a job this owner cannot read gives no row at all.
_POINTS_PAGE = (
    select(MetricPoint.step, *(getattr(MetricPoint, f) for f in POINT_FIELDS), MetricPoint.extra)
    .where(MetricPoint.job_id == bindparam("job_id"), MetricPoint.step > bindparam("after_step"))
    .order_by(MetricPoint.step)
    .limit(bindparam("limit", type_=Integer))
    .subquery("page")
)
_METRICS_POLL = (
    select(Job.status, *_POINTS_PAGE.c)
    .select_from(Job)
    .outerjoin(_POINTS_PAGE, true())
    .where(Job.owner == bindparam("owner"), Job.id == bindparam("job_id"))
    .order_by(_POINTS_PAGE.c.step)
)


class MetricsPoll:
    """The metrics poll on a pooled DBAPI connection, with no ORM session or SQLAlchemy Connection.

    Every open dashboard repeats this poll every few seconds; the session and Connection around one
    prebuilt statement cost more CPU than the statement (py-spy: a fifth of the request). The SQL is
    `_METRICS_POLL` compiled once for the engine's dialect, so it filters on the owner exactly as the
    ORM form did. Driver errors come out as SQLAlchemy's DBAPIError (the API's 503), and a connection
    that broke is dropped from the pool rather than handed to the next poll.
    """

    def __init__(self, engine: Engine):
        compiled = _METRICS_POLL.compile(dialect=engine.dialect)
        self._engine = engine
        self._sql = str(compiled)
        self._positions = compiled.positiontup  # None where the driver takes named parameters
        self._constants = compiled.params  # what the dialect binds itself (SQLite's `true()` is `1`)
        self._autocommit = engine.dialect.name == "postgresql"

    def _named(self, owner: str, job_id: str, after_step: int, limit: int) -> dict[str, Any]:
        return {**self._constants, "owner": owner, "job_id": job_id, "after_step": after_step, "limit": limit}

    def rows(self, owner: str, job_id: str, after_step: int, limit: int) -> tuple[str, list[Any]] | None:
        """The job's status and up to `limit` points after `after_step` (step first, then POINT_FIELDS,
        then `extra`: a dict, or its JSON text where the driver leaves it as text), or None when this
        owner cannot read the job."""
        named = self._named(owner, job_id, after_step, limit)
        params: Any = tuple(named[k] for k in self._positions) if self._positions else named
        dbapi_error = self._engine.dialect.loaded_dbapi.Error
        fairy = self._engine.raw_connection()
        dbapi_conn: Any = fairy.dbapi_connection
        try:
            if self._autocommit:
                # One statement that only reads: no BEGIN and ROLLBACK round trips around it.
                dbapi_conn.autocommit = True
            try:
                cursor = dbapi_conn.cursor()
                cursor.execute(self._sql, params)
                rows = cursor.fetchall()
                cursor.close()
            finally:
                if self._autocommit and not dbapi_conn.closed:
                    # Back as the pool hands connections out: ORM sessions expect transactions.
                    dbapi_conn.autocommit = False
        except dbapi_error as exc:
            gone = self._engine.dialect.is_disconnect(exc, dbapi_conn, None) or bool(
                getattr(dbapi_conn, "closed", False)
            )
            if gone:
                fairy.invalidate(exc)
            raise DBAPIError.instance(
                self._sql, params, exc, dbapi_error, connection_invalidated=gone
            ) from exc
        finally:
            fairy.close()
        return _status_and_points(rows)

    async def rows_on_loop(
        self, pool: AsyncReadPool, owner: str, job_id: str, after_step: int, limit: int
    ) -> tuple[str, list[Any]] | None:
        """rows() on the event loop, through the API's PostgreSQL read pool."""
        named = self._named(owner, job_id, after_step, limit)

        async def query(conn: Any) -> list[Any]:
            cursor = await conn.execute(self._sql, named)
            return list(await cursor.fetchall())

        dbapi_error = self._engine.dialect.loaded_dbapi.Error
        try:
            rows = await pool.run(query)
        except dbapi_error as exc:
            raise DBAPIError.instance(self._sql, named, exc, dbapi_error) from exc
        return _status_and_points(rows)


def _status_and_points(rows: Sequence[Any]) -> tuple[str, list[Any]] | None:
    if not rows:
        return None
    status = str(rows[0][0])
    if rows[0][1] is None:  # the job, no points after after_step
        return status, []
    return status, [r[1:] for r in rows]


class JobRepository(OwnedRepository):
    model = Job

    def get(self, job_id: str) -> Job | None:
        return self.session.scalars(self._readable().where(Job.id == job_id)).first()

    def list_page(self, *, statuses: Sequence[str] | None, limit: int, before_seq: int | None) -> list[Job]:
        stmt = self._readable()
        if statuses:
            stmt = stmt.where(Job.status.in_(list(statuses)))
        if before_seq is not None:
            stmt = stmt.where(Job.seq < before_seq)
        # The plan (rendered config and scripts) is not part of a listed job: not read at all.
        stmt = stmt.options(defer(Job.plan, raiseload=True))
        return list(self.session.scalars(stmt.order_by(Job.seq.desc()).limit(limit)))

    def count_active(self) -> int:
        stmt = (
            select(func.count())
            .select_from(Job)
            .where(Job.owner == self.owner, Job.status.in_([s.value for s in ACTIVE]))
        )
        return int(self.session.scalar(stmt) or 0)

    def queue_of(self, job_ids: Sequence[str]) -> dict[str, JobQueue]:
        """Why these jobs (this owner's) wait, as the scheduler last wrote it."""
        if not job_ids:
            return {}
        stmt = (
            select(JobQueue)
            .join(Job, Job.id == JobQueue.job_id)
            .where(Job.owner == self.owner, JobQueue.job_id.in_(list(job_ids)))
        )
        return {row.job_id: row for row in self.session.scalars(stmt)}

    def usage_rows(
        self, since: datetime | None, until: datetime | None
    ) -> list[tuple[str, datetime, float, str]]:
        """(owner, finished_at, device_seconds, device) of this owner's runs that ended in [since, until)."""
        stmt = (
            self._readable()
            .with_only_columns(Job.owner, Job.finished_at, Job.device_seconds, Job.device)
            .where(Job.device_seconds.is_not(None), Job.finished_at.is_not(None))
        )
        if since is not None:
            stmt = stmt.where(Job.finished_at >= since)
        if until is not None:
            stmt = stmt.where(Job.finished_at < until)
        return [
            (o, f, float(d), dev)
            for o, f, d, dev in self.session.execute(stmt)
            if f is not None and d is not None
        ]

    def add_with_dispatch(self, job: Job) -> Dispatch:
        """The job, its dispatch record and its first events (created, queued) in the caller's
        transaction: none exists without the others."""
        self.session.add(job)
        self.session.flush()
        dispatch = Dispatch(job_id=job.id, kind="submit", created_at=job.created_at, attempts=0)
        self.session.add(dispatch)
        self.session.flush()
        events.record(self.session, job.id, EventType.created, {"name": job.name}, owner=job.owner)
        _transition_event(self.session, job.id, JobStatus.queued, {})
        return dispatch

    def samples_after(self, job_id: str, *, after_step: int, steps: int) -> tuple[Job, list[Sample]] | None:
        """The job and its samples of up to `steps` steps after `after_step` (every prompt of a step
        together), ordered by step and prompt; None when this owner cannot read the job."""
        job = self.get(job_id)
        if job is None:
            return None
        page_steps = (
            select(Sample.step)
            .where(Sample.job_id == job_id, Sample.step > after_step)
            .group_by(Sample.step)
            .order_by(Sample.step)
            .limit(steps)
            .subquery()
        )
        stmt = (
            select(Sample)
            .where(Sample.job_id == job_id, Sample.step.in_(select(page_steps.c.step)))
            .order_by(Sample.step, Sample.prompt_index)
        )
        return job, list(self.session.scalars(stmt))

    # Idempotency keys -----------------------------------------------------------------------------
    def get_idempotency(self, key: str) -> IdempotencyKey | None:
        return self.session.get(IdempotencyKey, (self.owner, key))

    def reserve_idempotency(self, key: str, request_hash: str, ttl: timedelta) -> IdempotencyKey:
        now = utcnow()
        row = IdempotencyKey(
            owner=self.owner,
            key=key,
            request_hash=request_hash,
            job_id=None,
            created_at=now,
            expires_at=now + ttl,
        )
        self.session.add(row)
        self.session.flush()
        return row

    def drop_idempotency(self, key: str) -> None:
        self.session.execute(
            delete(IdempotencyKey).where(IdempotencyKey.owner == self.owner, IdempotencyKey.key == key)
        )


# System operations (no owner: the worker acts for every owner) -------------------------------------


def get_job(session: Session, job_id: str) -> Job | None:
    return session.scalars(select(Job).where(Job.id == job_id)).first()


# Compare-and-set: every status change of a job, through the one mechanism of every kind of run -----------


def _settle_end(
    session: Session, job_id: str, *, run_started: datetime | None, run_ended: datetime | None
) -> None:
    """An ended job waits no more, and its run counts in its owner's usage (`account_run`)."""
    session.execute(delete(JobQueue).where(JobQueue.job_id == job_id))
    account_run(session, job_id, run_started=run_started, run_ended=run_ended)


def _transition_event(
    session: Session, job_id: str, to: JobStatus, values: dict[str, Any], *, reason: str | None = None
) -> None:
    """The event a status change is (ftq.contract.events.EventType), recorded with it; `starting` and
    `cancelling` are steps on the way to one and have none."""
    if to == JobStatus.queued:
        row = session.execute(select(Job.attempt, Job.owner).where(Job.id == job_id)).first()
        if row is None:
            return
        attempt, owner = row
        if reason is not None and reason.startswith(RESUMED):  # a resume of a paused job
            resumed = {"checkpoint": _checkpoint_of(reason.removeprefix(RESUMED))}
            events.record(session, job_id, EventType.resumed, resumed, owner=owner)
        elif attempt or reason:  # back in the queue: a retry, or a claim that was never launched
            data: dict[str, Any] = {"attempt": int(attempt or 0), "reason": reason}
            events.record(session, job_id, EventType.retried, data, owner=owner)
        position = events.queue_position(session, job_id)
        events.record(session, job_id, EventType.queued, {"position": position}, owner=owner)
    elif to == JobStatus.running:
        job = session.execute(select(Job.launcher, Job.spec, Job.attempt).where(Job.id == job_id)).first()
        if job is None:
            return
        launcher, spec, attempt = job
        resources = (spec or {}).get("resources") or {}
        data = {
            "launcher": launcher,
            "host": _hostname() if launcher == "local" else None,
            "external_id": values.get("external_id"),
            "slurm_job_id": values.get("external_id") if launcher == "slurm" else None,
            "pid": values.get("pid"),
            "num_nodes": resources.get("num_nodes", 1),
            "processes_per_node": resources.get("processes_per_node", 1),
            "attempt": int(attempt or 0),
        }
        events.record(session, job_id, EventType.started, data)
    elif to == JobStatus.paused:
        step = session.scalar(select(Job.progress_step).where(Job.id == job_id))
        events.record(session, job_id, EventType.paused, {"step": step, "checkpoint": _checkpoint_of(reason)})
    elif to in TERMINAL:
        data = {}
        if to != JobStatus.succeeded and values.get("error_code"):
            data["error"] = {
                "code": values.get("error_code"),
                "message": values.get("error_message"),
                "exit_code": values.get("exit_code"),
            }
        events.record(session, job_id, EventType(f"job.{to.value}"), data)


# The reason a resume moves a paused job back to the queue with (its `job.resumed` event, not a retry),
# followed by `checkpoint:<step>` when its next run continues from one.
RESUMED = "resumed"


def checkpoint_reason(step: int | None) -> str:
    """How a pause or a resume names the checkpoint in its reason (the event's `checkpoint`)."""
    return f"checkpoint:{step}" if step is not None else ""


def _checkpoint_of(reason: str | None) -> int | None:
    if reason and "checkpoint:" in reason:
        with contextlib.suppress(ValueError):
            return int(reason.rsplit("checkpoint:", 1)[1])
    return None


def _hostname() -> str:
    import socket

    return socket.gethostname()


# A job's transitions: the event each change is, in its transaction; an end settles its queue row and
# its usage. `request_cancel` is the API's cancel of a job.
JOBS = RunTable(Job, cancel_dispatch="cancel", on_moved=_transition_event, on_ended=_settle_end)
request_cancel = JOBS.request_cancel

# Pause and resume (a job's own: exports are not paused) ---------------------------------------------------

PAUSABLE = (JobStatus.starting, JobStatus.running)


def request_pause(session: Session, job_id: str) -> str | None:
    """A queued job is held at once (`-> paused`); a starting or running one gets `pause_requested_at`,
    and the worker's sweep stops its run with a checkpoint and then moves it to `paused`. Returns the
    status now (`paused`, or the launched status with the request) or None when nothing changed (already
    paused or pausing, or a status a pause does not apply to)."""
    if JOBS.hold(session, job_id, pause_requested_at=None):
        session.execute(delete(JobQueue).where(JobQueue.job_id == job_id))
        return JobStatus.paused
    stmt = (
        update(Job)
        .where(Job.id == job_id, Job.status.in_([str(s) for s in PAUSABLE]), Job.pause_requested_at.is_(None))
        .values(pause_requested_at=utcnow(), updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    if rowcount(session.execute(stmt)) == 1:
        return session.scalar(select(Job.status).where(Job.id == job_id))
    return None


def mark_paused(
    session: Session,
    job_id: str,
    *,
    attempt: int | None,
    checkpoint: int | None,
    run_ended: datetime | None = None,
) -> bool:
    """starting/running -> paused once its run has ended after a pause: the devices go back, the launch
    handle is dropped (the next run is a new attempt, `attempt`, that resumes from the run's newest
    checkpoint; None: a claim paused before its launch, the same attempt), and the run so far counts in
    its owner's usage."""
    was_running = session.scalar(select(Job.status).where(Job.id == job_id)) == JobStatus.running
    more: dict[str, Any] = {} if attempt is None else {"attempt": attempt}
    moved = JOBS.mark_paused(
        session, job_id, reason=checkpoint_reason(checkpoint), pause_requested_at=None, **more
    )
    if moved:
        session.execute(delete(JobQueue).where(JobQueue.job_id == job_id))
        if was_running:  # a claim paused before its run started held its devices for no run
            account_run(session, job_id, run_ended=run_ended or utcnow(), ended=False)
    return moved


def hold_paused(session: Session) -> list[str]:
    """Queued jobs with a pause asked of them (a claim that went back to the queue before its launch):
    held now, never placed. Returns their ids."""
    ids = list(
        session.scalars(
            select(Job.id).where(Job.status == JobStatus.queued, Job.pause_requested_at.is_not(None))
        )
    )
    return [i for i in ids if JOBS.hold(session, i, pause_requested_at=None)]


def resume(session: Session, job_id: str, *, checkpoint: int | None) -> bool:
    """paused -> queued, with the dispatch that wakes the scheduler; its next run continues from
    `checkpoint` (the run's newest, None: from the start)."""
    return JOBS.resume(session, job_id, reason=RESUMED + checkpoint_reason(checkpoint))


def jobs_in(
    session: Session, statuses: Iterable[str], *, launcher: str | None = None, lean: bool = False
) -> list[Job]:
    """Jobs in these statuses, oldest first. `lean`: without the spec, plan and latest metrics (the
    sweep over every running job reads none of them; each is a JSON document to parse)."""
    stmt = select(Job).where(Job.status.in_(list(statuses)))
    if lean:
        stmt = stmt.options(
            defer(Job.spec, raiseload=True),
            defer(Job.plan, raiseload=True),
            defer(Job.latest_metrics, raiseload=True),
            defer(Job.resources, raiseload=True),
        )
    if launcher:
        stmt = stmt.where(Job.launcher == launcher)
    return list(session.scalars(stmt.order_by(Job.seq)))


# Scheduling and accounting ------------------------------------------------------------------------------


def queued_for_scheduling(session: Session) -> list[Any]:
    """Every queued job, narrow: (id, owner, seq, created_at, priority, devices, limit_seconds,
    estimated_seconds, launcher, device); `specs_of` fills in rows stored before these columns existed."""
    stmt = select(
        Job.id,
        Job.owner,
        Job.seq,
        Job.created_at,
        Job.priority,
        Job.devices,
        Job.limit_seconds,
        Job.estimated_seconds,
        Job.launcher,
        Job.device,
    ).where(Job.status == JobStatus.queued)
    return list(session.execute(stmt.order_by(Job.seq)))


def specs_of(session: Session, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    if not job_ids:
        return {}
    rows = session.execute(select(Job.id, Job.spec).where(Job.id.in_(list(job_ids))))
    return {job_id: spec for job_id, spec in rows}


def holding_devices(session: Session) -> list[Any]:
    """Jobs holding local devices: (id, owner, resources, started_at, limit_seconds, estimated_seconds,
    eta_seconds, device, devices)."""
    stmt = select(
        Job.id,
        Job.owner,
        Job.resources,
        Job.started_at,
        Job.limit_seconds,
        Job.estimated_seconds,
        Job.eta_seconds,
        Job.device,
        Job.devices,
    ).where(Job.status.in_(list(LAUNCHED)), Job.resources.is_not(None))
    return [r for r in session.execute(stmt) if r.resources]


def owner_usage(session: Session) -> list[OwnerUsage]:
    return list(session.scalars(select(OwnerUsage)))


def _decayed(value: float, since: datetime, now: datetime, half_life_seconds: float) -> float:
    age = max(0.0, (now - since).total_seconds())
    return float(value * 0.5 ** (age / half_life_seconds))


def recent_usage(row: OwnerUsage, now: datetime, half_life_seconds: float) -> float:
    """An owner's decayed device-seconds as of `now`."""
    return _decayed(row.recent_device_seconds, row.recent_at, now, half_life_seconds)


def period_start(now: datetime, period_seconds: float) -> datetime:
    """The start of the quota period `now` is in: fixed windows counted from the Unix epoch."""
    start = (now.timestamp() // period_seconds) * period_seconds
    return datetime.fromtimestamp(start, UTC)


def account_run(
    session: Session,
    job_id: str,
    *,
    run_started: datetime | None = None,
    run_ended: datetime | None = None,
    ended: bool = True,
) -> float | None:
    """Devices held x wall time of an ended run, on the job (`device_seconds`, `run_seconds`, added to
    what its runs before a pause held) and in its owner's usage. A job that never started is not
    accounted. `ended`: False for a run a pause ended (the job is not counted as one more job yet).
    Returns the device-seconds."""
    from ftq.runtime.settings import get_settings  # the store module is imported by migrations: settings late

    row = session.execute(
        select(
            Job.owner,
            Job.started_at,
            Job.finished_at,
            Job.devices,
            Job.device,
            Job.spec,
            Job.device_seconds,
            Job.run_seconds,
        ).where(Job.id == job_id)
    ).one_or_none()
    if row is None:
        return None
    start = run_started or row.started_at
    end = run_ended or row.finished_at
    if start is None or end is None:
        return None
    devices = row.devices
    if devices is None:
        res = row.spec.get("resources") or {}
        devices = int(res.get("processes_per_node", 1)) * int(res.get("num_nodes", 1))
    seconds = max(0.0, (end - start).total_seconds())
    used = float(devices * seconds)
    session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(
            device_seconds=(row.device_seconds or 0.0) + used, run_seconds=(row.run_seconds or 0.0) + seconds
        )
    )
    settings = get_settings()
    _add_usage(
        session,
        row.owner,
        device_seconds=used,
        gpu_seconds=used if row.device == "cuda" else 0.0,
        now=utcnow(),
        half_life_seconds=settings.fair_share_half_life_hours * 3600,
        period_seconds=settings.quota_period_hours * 3600,
        jobs=1 if ended else 0,
    )
    return used


def account_other_run(session: Session, owner: str, *, device_seconds: float, cuda: bool) -> None:
    """A run that is not a job (an export) in its owner's usage: fair share, this period's GPU-seconds and
    the totals; not in the owner's count of jobs."""
    from ftq.runtime.settings import get_settings  # the store module is imported by migrations: settings late

    settings = get_settings()
    _add_usage(
        session,
        owner,
        device_seconds=device_seconds,
        gpu_seconds=device_seconds if cuda else 0.0,
        now=utcnow(),
        half_life_seconds=settings.fair_share_half_life_hours * 3600,
        period_seconds=settings.quota_period_hours * 3600,
        jobs=0,
    )


def _add_usage(
    session: Session,
    owner: str,
    *,
    device_seconds: float,
    gpu_seconds: float,
    now: datetime,
    half_life_seconds: float,
    period_seconds: float,
    jobs: int = 1,
) -> None:
    dialect = session.get_bind().dialect.name
    ins: Any = postgresql.insert(OwnerUsage) if dialect == "postgresql" else sqlite.insert(OwnerUsage)
    session.execute(
        ins.values(
            owner=owner,
            recent_device_seconds=0.0,
            recent_at=now,
            period_start=period_start(now, period_seconds),
            period_gpu_seconds=0.0,
            total_device_seconds=0.0,
            total_gpu_seconds=0.0,
            total_jobs=0,
        ).on_conflict_do_nothing(index_elements=[OwnerUsage.owner])
    )
    row = session.scalars(select(OwnerUsage).where(OwnerUsage.owner == owner).with_for_update()).one()
    current = period_start(now, period_seconds)
    period_used = row.period_gpu_seconds if row.period_start == current else 0.0
    session.execute(
        update(OwnerUsage)
        .where(OwnerUsage.owner == owner)
        .values(
            recent_device_seconds=recent_usage(row, now, half_life_seconds) + device_seconds,
            recent_at=now,
            period_start=current,
            period_gpu_seconds=period_used + gpu_seconds,
            total_device_seconds=OwnerUsage.total_device_seconds + device_seconds,
            total_gpu_seconds=OwnerUsage.total_gpu_seconds + gpu_seconds,
            total_jobs=OwnerUsage.total_jobs + jobs,
        )
        .execution_options(synchronize_session=False)
    )


def save_queue(
    session: Session,
    rows: dict[str, tuple[int | None, str, datetime | None]],
    *,
    local: bool = True,
    table: type[JobQueue] | type[ExportQueue] | type[EvaluationQueue] | type[DeploymentQueue] = JobQueue,
) -> int:
    """Replace the scheduler's queue rows of `table` (jobs', or exports') with `rows` (id -> position,
    reason, estimated start), writing only what changed. `local`: rows with a position (local runs, every
    one not in `rows` is dropped); otherwise SLURM's pending reasons for these jobs (others untouched).
    Returns rows written."""
    # The run's id: job_id, export_id or evaluation_id (each queue table's one primary key column).
    key = getattr(table, next(iter(table.__table__.primary_key)).name)
    existing = {
        r[0]: (r.position, r.reason, r.estimated_start)
        for r in session.execute(
            select(key, table.position, table.reason, table.estimated_start).where(
                table.position.is_not(None) if local else key.in_(list(rows))
            )
        )
    }
    if local:
        gone = [j for j in existing if j not in rows]
        for i in range(0, len(gone), 1000):
            session.execute(delete(table).where(key.in_(gone[i : i + 1000])))
    changed = [
        {key.key: j, "position": p, "reason": r, "estimated_start": e}
        for j, (p, r, e) in rows.items()
        if existing.get(j) != (p, r, e)
    ]
    if changed:
        dialect = session.get_bind().dialect.name
        ins: Any = postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
        stmt = ins.on_conflict_do_update(
            index_elements=[key],
            set_={c: getattr(ins.excluded, c) for c in ("position", "reason", "estimated_start")},
        )
        session.connection().execute(stmt, changed)
    return len(changed)


def drop_queue_rows(session: Session, job_ids: Sequence[str]) -> None:
    if job_ids:
        session.execute(delete(JobQueue).where(JobQueue.job_id.in_(list(job_ids))))


def usage_totals(session: Session) -> list[OwnerUsage]:
    """Every owner's running totals (the /metrics counters)."""
    return list(session.scalars(select(OwnerUsage).order_by(OwnerUsage.owner)))


def queue_reasons(session: Session) -> dict[str, int]:
    rows = session.execute(select(JobQueue.reason, func.count()).group_by(JobQueue.reason)).all()
    return {str(r): int(n) for r, n in rows}


# Dispatch outbox ---------------------------------------------------------------------------------------


def unsent_dispatches(session: Session, *, older_than: timedelta, limit: int = 100) -> list[Dispatch]:
    cutoff = utcnow() - older_than
    stmt = (
        select(Dispatch)
        .where(Dispatch.sent_at.is_(None), Dispatch.created_at <= cutoff)
        .order_by(Dispatch.id)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def pending_dispatches_for(session: Session, job_id: str) -> list[Dispatch]:
    stmt = select(Dispatch).where(Dispatch.job_id == job_id, Dispatch.sent_at.is_(None)).order_by(Dispatch.id)
    return list(session.scalars(stmt))


def mark_dispatch_sent(session: Session, dispatch_id: int) -> None:
    session.execute(
        update(Dispatch)
        .where(Dispatch.id == dispatch_id)
        .values(sent_at=utcnow(), attempts=Dispatch.attempts + 1)
    )


def mark_dispatch_failed(session: Session, dispatch_id: int) -> None:
    session.execute(update(Dispatch).where(Dispatch.id == dispatch_id).values(attempts=Dispatch.attempts + 1))


def purge_expired_idempotency(session: Session) -> int:
    res = session.execute(delete(IdempotencyKey).where(IdempotencyKey.expires_at < utcnow()))
    return rowcount(res)


# Ingest ------------------------------------------------------------------------------------------------


def upsert_points(session: Session, job_id: str, points: Sequence[dict[str, Any]]) -> None:
    """Insert points, or merge into the row of the same step (a train and an eval point share a step).

    A field already stored is only replaced by a non-null value, so reading a line twice is harmless.
    """
    if not points:
        return
    merged: dict[int, dict[str, Any]] = {}
    for p in points:
        row = merged.setdefault(int(p["step"]), {"job_id": job_id, "step": int(p["step"])})
        for f in POINT_FIELDS:
            if p.get(f) is not None:
                row[f] = p[f]
        if p.get("extra"):
            row["extra"] = {**row.get("extra", {}), **p["extra"]}
    rows = [{f: r.get(f) for f in ("job_id", "step", *POINT_FIELDS, "extra")} for r in merged.values()]
    dialect = session.get_bind().dialect.name
    ins: Any = postgresql.insert(MetricPoint) if dialect == "postgresql" else sqlite.insert(MetricPoint)
    excluded = ins.excluded
    stmt = ins.on_conflict_do_update(
        index_elements=[MetricPoint.job_id, MetricPoint.step],
        set_={
            **{f: func.coalesce(getattr(excluded, f), getattr(MetricPoint, f)) for f in POINT_FIELDS},
            "extra": _merged_extra(dialect, MetricPoint.extra, excluded.extra),
        },
    )
    # executemany of one cached statement: a multi-row .values(rows) compiles a new statement for every
    # batch, with 9 parameters per row, and PostgreSQL refuses more than 65,535 (about 7,000 rows).
    session.connection().execute(stmt, rows)


def _merged_extra(dialect: str, stored: Any, incoming: Any) -> Any:
    """The stored `extra` with the incoming names added or replaced (a train and an eval line of one step
    each bring their own); the stored one when nothing comes in."""
    merged: Any
    if dialect == "postgresql":
        empty = cast(literal("{}"), JSONB)
        merged = cast(func.coalesce(cast(stored, JSONB), empty).op("||")(cast(incoming, JSONB)), JSON)
    else:
        merged = func.json_patch(func.coalesce(stored, "{}"), incoming)
    return case((incoming.is_(None), stored), else_=merged)


def update_progress(
    session: Session,
    job_id: str,
    *,
    metrics_offset: int,
    step: int | None,
    max_steps: int | None,
    epoch: float | None,
    eta_seconds: float | None,
    latest: dict[str, Any] | None,
) -> None:
    values: dict[str, Any] = {"metrics_offset": metrics_offset}
    if step is not None:
        values["progress_step"] = step
    if max_steps is not None:
        values["progress_max_steps"] = max_steps
    if epoch is not None:
        values["progress_epoch"] = epoch
    if eta_seconds is not None:
        values["eta_seconds"] = eta_seconds
    if latest is not None:
        values["latest_metrics"] = latest
    session.execute(update(Job).where(Job.id == job_id).values(**values))


def count_by_status(session: Session) -> dict[str, int]:
    rows = session.execute(select(Job.status, func.count()).group_by(Job.status)).all()
    return {str(s): int(n) for s, n in rows}


def upsert_samples(session: Session, job_id: str, samples: Sequence[dict[str, Any]]) -> None:
    """Insert samples, or replace the row of the same (step, prompt index): a line read twice, or a
    resumed run that samples a step again, leaves one row holding the latest completion."""
    if not samples:
        return
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for s in samples:
        key = (int(s["step"]), int(s["index"]))
        rows[key] = {
            "job_id": job_id,
            "step": key[0],
            "prompt_index": key[1],
            "prompt": s["prompt"],
            "completion": s["completion"],
            "time": s.get("time"),
            "reward": s.get("reward"),
        }
    dialect = session.get_bind().dialect.name
    ins: Any = postgresql.insert(Sample) if dialect == "postgresql" else sqlite.insert(Sample)
    stmt = ins.on_conflict_do_update(
        index_elements=[Sample.job_id, Sample.step, Sample.prompt_index],
        set_={f: getattr(ins.excluded, f) for f in ("prompt", "completion", "time", "reward")},
    )
    session.connection().execute(stmt, list(rows.values()))


def update_samples_offset(session: Session, job_id: str, offset: int) -> None:
    session.execute(update(Job).where(Job.id == job_id).values(samples_offset=offset))
