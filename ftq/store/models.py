"""The store's tables. Alembic migrations in `migrations/` create them; nothing calls create_all."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy import DateTime as _DateTime
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class DateTime(TypeDecorator[datetime]):
    """Timestamps are UTC and always come back timezone-aware.

    PostgreSQL keeps the zone; SQLite drops it and would hand back naive values, which serialise
    without an offset (not an RFC 3339 date-time) and cannot be compared with aware ones.
    """

    impl = _DateTime(timezone=True)
    cache_ok = True

    def __init__(self, timezone: bool = True) -> None:
        super().__init__()

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    pass


class RunState:
    """The columns every kind of run (a job, an export) has: its status and times, what the launcher
    knows about it, and how it ended. `ftq.store.transitions.RunTable` moves any of them through the
    statuses of `ftq.contract.status`."""

    status: Mapped[str] = mapped_column(String(16), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # What the launcher knows about the run: SLURM job id, or the local process group's pid and its
    # start time (a pid alone can be reused by an unrelated process after a reboot or wrap-around).
    external_id: Mapped[str | None] = mapped_column(String(64))
    pid: Mapped[int | None] = mapped_column(Integer)
    pid_start_ticks: Mapped[int | None] = mapped_column(BigInteger)
    resources: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # GPUs or CPU slots held
    error_code: Mapped[str | None] = mapped_column(String(32))
    error_message: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(Integer)


class Job(RunState, Base):
    __tablename__ = "jobs"

    # `seq` orders jobs (newest first) and is the list cursor: new rows only ever get larger values,
    # so a page boundary never shifts while jobs are being added.
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True, nullable=False)
    name: Mapped[str] = mapped_column(String(64), nullable=False)
    owner: Mapped[str] = mapped_column(String(128), nullable=False)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    plan: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    launcher: Mapped[str] = mapped_column(String(16), nullable=False)
    device: Mapped[str] = mapped_column(String(8), nullable=False)
    attempt: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    # A pause asked of a launched run: the run stays starting/running until its ranks have checkpointed
    # and ended, then the worker moves it to `paused` (and clears this); a resume clears it too.
    pause_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    # Progress, kept current by ingest.
    metrics_offset: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    progress_step: Mapped[int | None] = mapped_column(Integer)
    progress_max_steps: Mapped[int | None] = mapped_column(Integer)
    progress_epoch: Mapped[float | None] = mapped_column(Float)
    eta_seconds: Mapped[float | None] = mapped_column(Float)
    latest_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # How far ingest has read the run's samples.jsonl (bytes), as metrics_offset for metrics.jsonl.
    samples_offset: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0, server_default="0")

    # Scheduling (worker/scheduling.py), copied out of the spec and plan at submit so that a scheduler
    # tick reads narrow columns, not every queued job's JSON.
    priority: Mapped[str | None] = mapped_column(String(8))
    devices: Mapped[int | None] = mapped_column(Integer)  # GPUs of a cuda job, processes of a cpu job
    limit_seconds: Mapped[float | None] = mapped_column(Float)  # resources.max_seconds or slurm time_limit
    estimated_seconds: Mapped[float | None] = mapped_column(Float)  # plan.time_estimate.seconds
    # Accounting: devices held x wall time of the run, set when it ends.
    device_seconds: Mapped[float | None] = mapped_column(Float)
    run_seconds: Mapped[float | None] = mapped_column(Float)

    __table_args__ = (
        Index("ix_jobs_owner_seq", "owner", "seq"),
        Index("ix_jobs_owner_status_seq", "owner", "status", "seq"),
        Index("ix_jobs_status", "status"),
        Index("ix_jobs_finished_at", "finished_at"),
    )


class QueuePlace:
    """The columns of a queued run's row in its queue table (every kind of run waits in one queue): its
    position, why it waits (`ftq.contract.schemas.QueueInfo`), and when it is expected to start."""

    position: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(64), nullable=False)
    estimated_start: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class JobQueue(QueuePlace, Base):
    """Why each queued job waits, written by the scheduler on every tick; the API only reads it. SLURM
    jobs pending in SLURM's queue have SLURM's reason here (no position)."""

    __tablename__ = "job_queue"

    job_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )


class ExportQueue(QueuePlace, Base):
    """Why each queued export waits, written by the scheduler on every tick as `job_queue` is for jobs
    (exports and jobs wait in one queue); the API only reads it."""

    __tablename__ = "export_queue"

    export_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("exports.id", ondelete="CASCADE"), primary_key=True
    )


class Deployment(RunState, Base):
    """One serving engine (issue 49): a base model served for one owner with that owner's adapters on it,
    a run the one scheduler places like a job's (`devices` GPUs or CPU slots of `launcher`'s pool) and the
    worker launches through the launchers. Statuses and transitions are a job's (`ftq.contract.status`):
    running is launched; `ready_at` says it has answered. It ends cancelled when it is stopped (idle, or
    on request). `key`: which engine this is within its owner's (its base folder); `config`: what the
    engine runs (`ftq.engine.EngineConfig`'s fields, the server's paths); `api_key`: the engine's own key,
    which the API sends with each call to it."""

    __tablename__ = "deployments"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True, nullable=False)
    owner: Mapped[str] = mapped_column(String(128), nullable=False)
    key: Mapped[str] = mapped_column(Text, nullable=False)
    label: Mapped[str] = mapped_column(String(512), nullable=False)
    launcher: Mapped[str] = mapped_column(String(16), nullable=False)
    device: Mapped[str] = mapped_column(String(8), nullable=False)
    devices: Mapped[int] = mapped_column(Integer, nullable=False)
    tensor_parallel_size: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    priority: Mapped[str] = mapped_column(String(8), nullable=False, default="normal")
    config: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    api_key: Mapped[str] = mapped_column(String(128), nullable=False)
    endpoint: Mapped[str | None] = mapped_column(String(256))
    ready_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    adapters: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # name -> loaded at (Unix seconds)
    requests: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)

    __table_args__ = (
        Index("ix_deployments_owner_key", "owner", "key"),
        Index("ix_deployments_status", "status"),
    )


class DeploymentQueue(QueuePlace, Base):
    """Why each queued deployment waits, written by the scheduler on every tick (it waits in the one queue
    with jobs, exports and evaluations); the API only reads it."""

    __tablename__ = "deployment_queue"

    deployment_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("deployments.id", ondelete="CASCADE"), primary_key=True
    )


class OwnerUsage(Base):
    """Each owner's usage, kept as runs end: decayed device-seconds (fair share), GPU-seconds of the
    current quota period, and running totals (the /metrics counters). O(owners) rows to read per tick."""

    __tablename__ = "owner_usage"

    owner: Mapped[str] = mapped_column(String(128), primary_key=True)
    recent_device_seconds: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    recent_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    period_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    period_gpu_seconds: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    total_device_seconds: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    total_gpu_seconds: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    total_jobs: Mapped[int] = mapped_column(Integer, nullable=False, default=0)


class MetricPoint(Base):
    __tablename__ = "metric_points"

    # (job_id, step) is the primary key: the index that serves `after_step` polls, and what makes
    # ingest idempotent (a line read twice updates the same row).
    job_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[float | None] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float)
    learning_rate: Mapped[float | None] = mapped_column(Float)
    grad_norm: Mapped[float | None] = mapped_column(Float)
    eval_loss: Mapped[float | None] = mapped_column(Float)
    tokens_per_second: Mapped[float | None] = mapped_column(Float)
    time: Mapped[float | None] = mapped_column(Float)
    # The method's metrics beyond the fixed fields, {TRL's name: value} (`rewards/margins`, `accuracy`).
    extra: Mapped[dict[str, float] | None] = mapped_column(JSON(none_as_null=True))


class Sample(Base):
    """One completion of one of the spec's sample prompts at one step (from the run's samples.jsonl)."""

    __tablename__ = "samples"

    # (job_id, step, prompt_index) is the primary key: the index that serves `after_step` polls, and what
    # makes ingest idempotent (a line read twice, or a resumed run sampling a step again, updates one row).
    job_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    prompt_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    prompt: Mapped[str] = mapped_column(Text, nullable=False)
    completion: Mapped[str] = mapped_column(Text, nullable=False)
    time: Mapped[float | None] = mapped_column(Float)
    # A GRPO rollout's reward (the grader's score of the completion); null for a sample prompt's.
    reward: Mapped[float | None] = mapped_column(Float)


class IdempotencyKey(Base):
    __tablename__ = "idempotency_keys"

    owner: Mapped[str] = mapped_column(String(128), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    job_id: Mapped[str | None] = mapped_column(String(40))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, index=True)


class Dispatch(Base):
    """The outbox: written in the same transaction as the job; the relay sends what was not sent."""

    __tablename__ = "dispatches"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(40), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # submit | cancel
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)

    __table_args__ = (Index("ix_dispatches_unsent", "sent_at", "id"),)


class Export(RunState, Base):
    """One export of a succeeded job's `final/` (merged weights or the adapter, in a dtype), run as a
    launch of its own through the job's launcher. Statuses and transitions are a job's
    (`ftq.contract.status`); whose it is comes from its job (the owner filter joins `jobs`)."""

    __tablename__ = "exports"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True, nullable=False)
    job_id: Mapped[str] = mapped_column(String(40), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # merged | adapter
    dtype: Mapped[str] = mapped_column(String(8), nullable=False)  # bf16 | fp16 | fp32
    max_shard_size: Mapped[str] = mapped_column(String(16), nullable=False)
    push_to_hub: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # {repo_id, private}
    step: Mapped[int | None] = mapped_column(Integer)  # the checkpoint exported; None: final/
    devices: Mapped[int | None] = mapped_column(Integer)  # what its launch ran on (None: one, before 0017)

    __table_args__ = (
        Index("ix_exports_job_seq", "job_id", "seq"),
        Index("ix_exports_status", "status"),
    )


class Evaluation(RunState, Base):
    """One evaluation of a job's saved checkpoint (`step`) or of its final/ (`step` null) with the spec's
    suites (`eval.suites`, or the named ones of `suites`), run as a launch of its own through the job's
    launcher like an export. `trigger`: checkpoint | final (queued by the worker as the spec's `eval.on`
    asks) or request (POST /jobs/{id}/evaluations). `metrics`: what its results.json reported, once it
    succeeded."""

    __tablename__ = "evaluations"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True, nullable=False)
    job_id: Mapped[str] = mapped_column(String(40), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)
    step: Mapped[int | None] = mapped_column(Integer)
    suites: Mapped[list[str] | None] = mapped_column(JSON)
    trigger: Mapped[str] = mapped_column(String(16), nullable=False)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    devices: Mapped[int | None] = mapped_column(Integer)  # what its launch ran on (None: one, before 0017)

    __table_args__ = (
        Index("ix_evaluations_job_seq", "job_id", "seq"),
        Index("ix_evaluations_status", "status"),
    )


class EvaluationQueue(QueuePlace, Base):
    """Why each queued evaluation waits (one queue with jobs and exports); the API only reads it."""

    __tablename__ = "evaluation_queue"

    evaluation_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("evaluations.id", ondelete="CASCADE"), primary_key=True
    )


# A 64-bit id that SQLite still numbers itself (only its INTEGER PRIMARY KEY is the rowid).
_EventId = BigInteger().with_variant(Integer(), "sqlite")


class JobEvent(Base):
    """A job's event log (ftq.contract.events.EventType), written in the transaction of the change it
    describes.

    `id` is the cursor of `GET /events?after=`: events are inserted one transaction at a time
    (ftq.store.events takes a lock on PostgreSQL), so a reader that saw id N never later finds a smaller
    one committed. `key` makes events read from the run directory idempotent: a re-ingest of the same
    checkpoint, eval or warning finds its key taken.
    """

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(_EventId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(40), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)
    owner: Mapped[str] = mapped_column(String(128), nullable=False)
    type: Mapped[str] = mapped_column(String(32), nullable=False)
    time: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    key: Mapped[str | None] = mapped_column(String(160))

    __table_args__ = (
        Index("ix_job_events_job_id_id", "job_id", "id"),
        Index("ix_job_events_owner_id", "owner", "id"),
        UniqueConstraint("job_id", "key", name="uq_job_events_job_id_key"),
    )


class Webhook(Base):
    __tablename__ = "webhooks"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner: Mapped[str] = mapped_column(String(128), nullable=False, index=True)
    url: Mapped[str] = mapped_column(Text, nullable=False)
    events: Mapped[list[str]] = mapped_column(JSON, nullable=False)
    secret: Mapped[str] = mapped_column(String(128), nullable=False)
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False, default=True)
    # Deliveries in a row that failed after all their retries; reset by a success or by enabling.
    consecutive_failures: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class WebhookDelivery(Base):
    """The webhook outbox: one row per (event, webhook), inserted with the event; the sender works it off."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[int] = mapped_column(_EventId, primary_key=True, autoincrement=True)
    webhook_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("webhooks.id", ondelete="CASCADE"), nullable=False
    )
    event_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("job_events.id", ondelete="CASCADE"), nullable=False
    )
    job_id: Mapped[str] = mapped_column(String(40), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)  # pending | succeeded | failed
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    first_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_order", "webhook_id", "job_id", "event_id"),
        Index("ix_webhook_deliveries_webhook_id_id", "webhook_id", "id"),
    )


class UploadedFile(Base):
    """A dataset file uploaded through `POST /files`; its bytes are at `ftq.runtime.files.file_path`.

    The row is also its own outbox entry: `validation_sent_at` is null until the validation task went to
    the broker, so the relay sends what the API could not (as `dispatches` do for jobs)."""

    __tablename__ = "files"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True, nullable=False)
    owner: Mapped[str] = mapped_column(String(128), nullable=False)
    filename: Mapped[str] = mapped_column(String(255), nullable=False)
    bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    rows: Mapped[int | None] = mapped_column(BigInteger)
    columns: Mapped[list[str] | None] = mapped_column(JSON)
    formats: Mapped[list[str] | None] = mapped_column(JSON)
    methods: Mapped[list[str] | None] = mapped_column(JSON)
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    error_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    validated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    validation_sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        Index("ix_files_owner_seq", "owner", "seq"),
        Index("ix_files_status_sent", "status", "validation_sent_at"),
    )


class OpenAIJob(Base):
    """What a job created through the OpenAI-compatible `/v1` API was asked for beyond its spec: the
    model as written (a catalog alias), the suffix, the metadata, the method with its hyperparameters
    resolved, the integrations. The job itself is an ordinary `jobs` row; `/v1` is a projection of it."""

    __tablename__ = "openai_jobs"

    job_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    model: Mapped[str] = mapped_column(String(256), nullable=False)
    suffix: Mapped[str | None] = mapped_column(String(64))
    seed: Mapped[int] = mapped_column(BigInteger, nullable=False)
    method: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)  # {type, <type>: {hyperparameters}}
    # OpenAI's metadata: up to 16 string keys and values.
    job_metadata: Mapped[dict[str, str] | None] = mapped_column("metadata", JSON)
    integrations: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)


class OpenAIUpload(Base):
    """An OpenAI-compatible Upload (`/v1/uploads`): a file sent in parts, joined by `complete`. `status`
    is pending, completing (one `complete` has claimed it and is joining the parts; never shown: it
    reads as pending), completed, cancelled or expired; `file_id` is the file `complete` made."""

    __tablename__ = "uploads"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True, nullable=False)
    owner: Mapped[str] = mapped_column(String(128), nullable=False)
    filename: Mapped[str] = mapped_column(String(255), nullable=False)
    purpose: Mapped[str] = mapped_column(String(64), nullable=False)
    bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)  # declared at create
    mime_type: Mapped[str] = mapped_column(String(255), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    file_id: Mapped[str | None] = mapped_column(String(40))

    __table_args__ = (
        Index("ix_uploads_owner_status", "owner", "status"),
        Index("ix_uploads_status_expires", "status", "expires_at"),
    )


class OpenAIUploadPart(Base):
    """A received part of an upload: its bytes are at `path` (the server's choice, relative to the
    owner's files folder), counted in the owner's file quota while the upload is unfinished."""

    __tablename__ = "upload_parts"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(40), unique=True, nullable=False)
    upload_id: Mapped[str] = mapped_column(
        String(40), ForeignKey("uploads.id", ondelete="CASCADE"), nullable=False
    )
    bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    path: Mapped[str] = mapped_column(String(255), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)

    __table_args__ = (Index("ix_upload_parts_upload_seq", "upload_id", "seq"),)


class TrainingClient(RunState, Base):
    """A Tinker training client (issue 52): a LoRA on a catalog base, resident in its own process between
    calls (`python -m trainer.tinker_host`), a run the one scheduler places like a deployment (`devices` of
    `launcher`'s pool) and the worker launches through the launchers. `id` is the Tinker model id
    (`<session_id>:train:<n>`); `config` what the host loads (the base folder, the LoRA, the seed, a
    state to start from); `api_key` the host's own key, which the API sends with each call to it."""

    __tablename__ = "training_clients"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(160), unique=True, nullable=False)
    owner: Mapped[str] = mapped_column(String(128), nullable=False)
    session_id: Mapped[str] = mapped_column(String(64), nullable=False)
    base: Mapped[str] = mapped_column(String(512), nullable=False)  # the catalog alias the caller named
    launcher: Mapped[str] = mapped_column(String(16), nullable=False)
    device: Mapped[str] = mapped_column(String(8), nullable=False)
    devices: Mapped[int] = mapped_column(Integer, nullable=False)
    priority: Mapped[str] = mapped_column(String(8), nullable=False, default="normal")
    config: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    lora_rank: Mapped[int] = mapped_column(Integer, nullable=False)
    user_metadata: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    api_key: Mapped[str] = mapped_column(String(128), nullable=False)
    endpoint: Mapped[str | None] = mapped_column(String(256))
    last_used_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    # Saved when idle (FTQ_TINKER_IDLE_SECONDS): the state's folder, while its run stops and it waits
    # paused for its next call (which queues a new run of the row that loads it).
    idle_state: Mapped[str | None] = mapped_column(Text)
    earlier_device_seconds: Mapped[float | None] = mapped_column(Float)  # its runs before this one

    __table_args__ = (
        Index("ix_training_clients_owner", "owner"),
        Index("ix_training_clients_status", "status"),
    )


class TrainingClientEvent(Base):
    """A training client's event log (`training_client.created`, `.started`, `.idle_saved`, `.resumed`,
    `.stopped`, `.failed`: ftq.contract.tinker.EVENT_TYPES), written in the transaction of the change."""

    __tablename__ = "training_client_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[str] = mapped_column(String(160), nullable=False)
    owner: Mapped[str] = mapped_column(String(128), nullable=False)
    type: Mapped[str] = mapped_column(String(40), nullable=False)
    time: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)

    __table_args__ = (Index("ix_training_client_events_model", "model_id", "id"),)


class TinkerSession(Base):
    """A Tinker SDK session (`create_session`): the owner's, kept alive by its heartbeats."""

    __tablename__ = "tinker_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(128), nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    last_heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    user_metadata: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    models: Mapped[int] = mapped_column(Integer, nullable=False, default=0)  # model_seq_ids handed out
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (Index("ix_tinker_sessions_owner", "owner"),)


class TinkerCheckpoint(Base):
    """A saved state (`weights`) or sampler weights (`sampler_weights`) of a training client: its
    `tinker://<model_id>/<kind>/<name>` path, and the folder the server chose for it under the data dir."""

    __tablename__ = "tinker_checkpoints"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    path: Mapped[str] = mapped_column(String(512), unique=True, nullable=False)
    owner: Mapped[str] = mapped_column(String(128), nullable=False)
    model_id: Mapped[str] = mapped_column(String(160), nullable=False)
    kind: Mapped[str] = mapped_column(String(16), nullable=False)  # weights | sampler_weights
    name: Mapped[str] = mapped_column(String(256), nullable=False)
    folder: Mapped[str] = mapped_column(Text, nullable=False)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (Index("ix_tinker_checkpoints_owner_model", "owner", "model_id"),)
