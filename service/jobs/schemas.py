"""The jobs API's request and response models: the contract's models live in the core
(`ftq.contract.schemas`),
shared with the client SDK; this module names them for the routes."""

from __future__ import annotations

from ftq.contract.schemas import (
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
from ftq.contract.status import TERMINAL, JobStatus

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
