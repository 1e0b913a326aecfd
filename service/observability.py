"""`GET /metrics`: Prometheus text about the queue, computed from the store at scrape time.

Every figure is read from the database when Prometheus scrapes, not counted in process memory, so
it is the same whichever API replica answers and survives restarts:

- `ftq_jobs{status}`: jobs per status (one GROUP BY).
- `ftq_queue_wait_seconds`: created -> started, for jobs started in the last hour (histogram).
- `ftq_dispatch_latency_seconds`: outbox record created -> sent to the broker, last hour (histogram).
- `ftq_dispatch_unsent`, `ftq_dispatch_oldest_unsent_seconds`: the outbox backlog.
- `ftq_oldest_queued_seconds`: how long the oldest queued job has waited.
- `ftq_ingest_lag_seconds`: now minus the newest point's time, for each running job (histogram; no
  job labels, so the series count stays fixed and no job id leaks through an unauthenticated scrape).
- `ftq_device_seconds_total{owner}`, `ftq_gpu_seconds_total{owner}`, `ftq_runs_accounted_total{owner}`:
  counters of what ended runs used (devices x wall time; the owner_usage table, one row per owner).
- `ftq_queue_waiting{reason}`: queued jobs by why they wait (no_free_devices, reservation, quota, or
  SLURM's pending reason).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ftq.contract.status import JobStatus
from ftq.runtime.settings import get_settings
from ftq.store.db import new_session
from ftq.store.models import Dispatch, Job, MetricPoint
from ftq.store.repository import count_by_status, queue_reasons, usage_totals, utcnow
from service.errors import Unauthorized

log = logging.getLogger(__name__)

router = APIRouter(include_in_schema=False)

WINDOW = timedelta(hours=1)
WAIT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0, 3600.0, 4 * 3600.0)
DISPATCH_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
INGEST_BUCKETS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)
MAX_ROWS = 10_000  # a scrape reads at most this many rows per query


def _aware(value: datetime) -> datetime:
    # SQLite hands timezone-aware columns back naive; they are stored in UTC.
    return value if value.tzinfo else value.replace(tzinfo=utcnow().tzinfo)


def _histogram(
    name: str, doc: str, values: Sequence[float], buckets: Sequence[float]
) -> HistogramMetricFamily:
    counts = []
    for bound in buckets:
        counts.append((repr(bound), sum(1 for v in values if v <= bound)))
    counts.append(("+Inf", len(values)))
    return HistogramMetricFamily(name, doc, buckets=counts, sum_value=float(sum(values)))


def queue_waits(session: Session, since: datetime) -> list[float]:
    rows = session.execute(
        select(Job.created_at, Job.started_at).where(Job.started_at >= since).limit(MAX_ROWS)
    ).all()
    return [max(0.0, (_aware(s) - _aware(c)).total_seconds()) for c, s in rows if s is not None]


def dispatch_latencies(session: Session, since: datetime) -> list[float]:
    rows = session.execute(
        select(Dispatch.created_at, Dispatch.sent_at).where(Dispatch.sent_at >= since).limit(MAX_ROWS)
    ).all()
    return [max(0.0, (_aware(s) - _aware(c)).total_seconds()) for c, s in rows if s is not None]


def unsent_dispatches(session: Session) -> tuple[int, datetime | None]:
    count, oldest = session.execute(
        select(func.count(), func.min(Dispatch.created_at)).where(Dispatch.sent_at.is_(None))
    ).one()
    return int(count or 0), oldest


def oldest_queued(session: Session) -> datetime | None:
    return session.scalar(select(func.min(Job.created_at)).where(Job.status == JobStatus.queued))


def ingest_lags(session: Session, now_unix: float) -> list[float]:
    """now - time of the newest point, per running job that has logged a point with a time."""
    newest = (
        select(func.max(MetricPoint.time))
        .where(MetricPoint.job_id == Job.id)
        .correlate(Job)
        .scalar_subquery()
    )
    rows = session.execute(select(newest).where(Job.status == JobStatus.running).limit(MAX_ROWS)).all()
    return [max(0.0, now_unix - t) for (t,) in rows if t is not None]


class StoreCollector(Collector):
    """Reads the store on every scrape; a store that does not answer yields `ftq_store_up 0`."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("ftq_store_up", "1 when the job store answered this scrape.")
        try:
            metrics = list(self._from_store())
        except Exception as exc:  # the scrape itself must still answer, so the outage is visible
            log.warning("metrics: store unavailable: %s", str(exc).splitlines()[0] if str(exc) else exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from metrics

    def _from_store(self) -> Iterable[Metric]:
        now = utcnow()
        since = now - WINDOW
        with new_session() as session:
            by_status = count_by_status(session)
            waits = queue_waits(session, since)
            dispatch = dispatch_latencies(session, since)
            unsent, oldest_unsent = unsent_dispatches(session)
            queued_since = oldest_queued(session)
            lags = ingest_lags(session, time.time())
            totals = [
                (u.owner, u.total_device_seconds, u.total_gpu_seconds, u.total_jobs)
                for u in usage_totals(session)
            ]
            waiting = queue_reasons(session)

        jobs = GaugeMetricFamily("ftq_jobs", "Jobs in the store, by status.", labels=["status"])
        for status in JobStatus:
            jobs.add_metric([status.value], by_status.get(status.value, 0))
        yield jobs
        yield _histogram(
            "ftq_queue_wait_seconds",
            "Created to started, for jobs started in the last hour.",
            waits,
            WAIT_BUCKETS,
        )
        yield _histogram(
            "ftq_dispatch_latency_seconds",
            "Outbox record created to sent to the broker, for records sent in the last hour.",
            dispatch,
            DISPATCH_BUCKETS,
        )
        yield GaugeMetricFamily(
            "ftq_dispatch_unsent", "Outbox records not yet sent to the broker.", value=unsent
        )
        yield GaugeMetricFamily(
            "ftq_dispatch_oldest_unsent_seconds",
            "Age of the oldest outbox record not yet sent (0 when none).",
            value=(now - _aware(oldest_unsent)).total_seconds() if oldest_unsent else 0.0,
        )
        yield GaugeMetricFamily(
            "ftq_oldest_queued_seconds",
            "How long the oldest queued job has waited (0 when none).",
            value=(now - _aware(queued_since)).total_seconds() if queued_since else 0.0,
        )
        yield _histogram(
            "ftq_ingest_lag_seconds",
            "Now minus the newest metric point's time, over running jobs that have logged a point.",
            lags,
            INGEST_BUCKETS,
        )
        yield GaugeMetricFamily(
            "ftq_ingest_lag_max_seconds",
            "The largest ingest lag over running jobs (0 when none).",
            value=max(lags, default=0.0),
        )
        device_s = CounterMetricFamily(
            "ftq_device_seconds", "Devices x wall time of ended runs, by owner.", labels=["owner"]
        )
        gpu_s = CounterMetricFamily(
            "ftq_gpu_seconds", "GPUs x wall time of ended cuda runs, by owner.", labels=["owner"]
        )
        runs_n = CounterMetricFamily(
            "ftq_runs_accounted", "Ended runs accounted, by owner.", labels=["owner"]
        )
        for owner, dev, gpu, n in totals:
            device_s.add_metric([owner], dev)
            gpu_s.add_metric([owner], gpu)
            runs_n.add_metric([owner], n)
        yield device_s
        yield gpu_s
        yield runs_n
        waiting_g = GaugeMetricFamily("ftq_queue_waiting", "Queued jobs by why they wait.", labels=["reason"])
        for reason, n in sorted(waiting.items()):
            waiting_g.add_metric([reason], n)
        yield waiting_g


registry = CollectorRegistry(auto_describe=False)
registry.register(StoreCollector())


def _check_metrics_token(request: Request) -> None:
    """With FTQ_METRICS_TOKEN set, a scrape must carry it as a bearer token (401 otherwise)."""
    expected = get_settings().metrics_token
    if not expected:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise Unauthorized("GET /metrics needs the bearer token FTQ_METRICS_TOKEN")


@router.get("/metrics")
def prometheus_metrics(request: Request) -> Response:
    # A sync route: FastAPI runs it in its thread pool, so the store queries do not block the loop.
    _check_metrics_token(request)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
