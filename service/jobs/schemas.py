"""Request and response models of the jobs API (the contract's Job, Point, pages)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from ftq.spec import JobSpec
from worker.render import Plan

# The plan is rendered by the worker's pure renderer; the API serves that same model.
PlanPublic = Plan


class JobStatus(StrEnum):
    queued = "queued"
    starting = "starting"
    running = "running"
    cancelling = "cancelling"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled})
ACTIVE = frozenset({JobStatus.queued, JobStatus.starting, JobStatus.running, JobStatus.cancelling})


class ErrorCode(StrEnum):
    invalid_spec = "invalid_spec"
    launch_error = "launch_error"
    dataset_error = "dataset_error"
    model_error = "model_error"
    out_of_memory = "out_of_memory"
    nccl_timeout = "nccl_timeout"
    rendezvous_error = "rendezvous_error"
    disk_full = "disk_full"
    time_limit = "time_limit"
    preempted = "preempted"
    node_failure = "node_failure"
    cancelled = "cancelled"
    unknown = "unknown"


class Point(BaseModel):
    step: int
    epoch: float | None = None
    loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    eval_loss: float | None = None
    tokens_per_second: float | None = None
    time: float | None = None


class Progress(BaseModel):
    step: int | None = None
    max_steps: int | None = None
    epoch: float | None = None
    eta_seconds: float | None = None


class JobError(BaseModel):
    code: ErrorCode
    message: str
    exit_code: int | None = None


class JobPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    owner: str
    status: JobStatus
    spec: JobSpec
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    launcher: str
    external_id: str | None
    progress: Progress
    latest_metrics: Point | None
    error: JobError | None


class JobList(BaseModel):
    data: list[JobPublic]
    next_cursor: str | None


class LogChunk(BaseModel):
    offset: int
    next_offset: int
    text: str
    complete: bool


class MetricsPage(BaseModel):
    data: list[Point]
    next_after_step: int
    complete: bool


class Checkpoint(BaseModel):
    step: int
    path: str
    resumable: bool


class CheckpointList(BaseModel):
    data: list[Checkpoint]


class ErrorBody(BaseModel):
    detail: str
    code: str


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)
