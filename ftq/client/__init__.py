"""The Python SDK for the ftq API: what internal tools use instead of hand-written HTTP calls.

    from ftq.client import Client

    with Client() as ftq:                      # FTQ_URL / FTQ_TOKEN, or Client(url, token)
        job = ftq.jobs.create("examples/tiny-cpu.yaml", idempotency_key="nightly-2024-06-01")
        for line in ftq.jobs.logs(job.id, follow=True):
            print(line)
        print(ftq.jobs.wait(job.id).status, [p.loss for p in ftq.jobs.iter_metrics(job.id)])

Responses are the API's own models (`ftq.contract.schemas`), failures typed exceptions (`ftq.client.errors`).
`client.deployments.list()` shows the engines that answer your `/v1` calls (`ftq.contract.serving`).
`AsyncClient` has the same surface for async code.
"""

from __future__ import annotations

from ftq.client._async import AsyncClient, AsyncDeployments, AsyncFiles, AsyncGraders, AsyncJobs
from ftq.client._core import DEFAULT_URL, OUTAGE_ERRORS, OUTAGE_PATIENCE_SECONDS, Downloaded, SpecInput
from ftq.client._sync import Client, Deployments, Files, Graders, Jobs
from ftq.client.errors import (
    ApiError,
    BadRequest,
    ChecksumMismatch,
    Conflict,
    ConnectionFailed,
    ConnectionLost,
    FieldError,
    Forbidden,
    FtqAPIError,
    FtqClientError,
    InvalidURL,
    NotFound,
    RateLimited,
    ServerError,
    ServerTimeout,
    SpecFileError,
    Unauthorized,
    Unavailable,
    UnexpectedResponse,
    ValidationError,
    WaitTimeout,
)
from ftq.contract.graders import GraderRunResponse, GraderValidateResponse
from ftq.contract.schemas import (
    Artifact,
    ArtifactList,
    Checkpoint,
    EvaluationPublic,
    Event,
    EventPage,
    ExportPublic,
    Health,
    JobList,
    JobPublic,
    LogChunk,
    MetricsPage,
    PlanPublic,
    Point,
    SamplePublic,
    SamplesPage,
)
from ftq.contract.serving import Deployment, DeploymentAdapter, DeploymentList, ServingUsage
from ftq.contract.spec import JobSpec
from ftq.contract.status import TERMINAL, JobStatus

__all__ = [
    "DEFAULT_URL",
    "OUTAGE_ERRORS",
    "OUTAGE_PATIENCE_SECONDS",
    "TERMINAL",
    "ApiError",
    "Artifact",
    "ArtifactList",
    "AsyncClient",
    "AsyncDeployments",
    "AsyncFiles",
    "AsyncGraders",
    "AsyncJobs",
    "BadRequest",
    "Checkpoint",
    "ChecksumMismatch",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "ConnectionLost",
    "Deployment",
    "DeploymentAdapter",
    "DeploymentList",
    "Deployments",
    "Downloaded",
    "EvaluationPublic",
    "Event",
    "EventPage",
    "ExportPublic",
    "FieldError",
    "Files",
    "Forbidden",
    "FtqAPIError",
    "FtqClientError",
    "GraderRunResponse",
    "GraderValidateResponse",
    "Graders",
    "Health",
    "InvalidURL",
    "JobList",
    "JobPublic",
    "JobSpec",
    "JobStatus",
    "Jobs",
    "LogChunk",
    "MetricsPage",
    "NotFound",
    "PlanPublic",
    "Point",
    "RateLimited",
    "SamplePublic",
    "SamplesPage",
    "ServerError",
    "ServerTimeout",
    "ServingUsage",
    "SpecFileError",
    "SpecInput",
    "Unauthorized",
    "Unavailable",
    "UnexpectedResponse",
    "ValidationError",
    "WaitTimeout",
]
