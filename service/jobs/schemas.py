"""Left only for `service.jobs.service` (being rewritten on another branch): the jobs API's models are
`ftq.contract.schemas`; import them from there. Delete this module once service.jobs.service does."""

from __future__ import annotations

from ftq.contract.schemas import JobError, JobPublic, PlanPublic, Progress

__all__ = ["JobError", "JobPublic", "PlanPublic", "Progress"]
