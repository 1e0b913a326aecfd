"""The jobs API's request and response models: the contract's models live in the core (`ftq.schemas`),
shared with the client SDK; this module names them for the routes."""

from __future__ import annotations

from ftq.schemas import (
    Checkpoint,
    CheckpointList,
    ErrorBody,
    Health,
    JobError,
    JobList,
    JobPublic,
    LogChunk,
    MetricsPage,
    PlanPublic,
    Point,
    Progress,
    SamplePublic,
    SamplesPage,
)
from ftq.status import TERMINAL, JobStatus

__all__ = [
    "TERMINAL",
    "Checkpoint",
    "CheckpointList",
    "ErrorBody",
    "Health",
    "JobError",
    "JobList",
    "JobPublic",
    "JobStatus",
    "LogChunk",
    "MetricsPage",
    "PlanPublic",
    "Point",
    "Progress",
    "SamplePublic",
    "SamplesPage",
]
