"""Every SQL statement of the OpenAI-compatible `/v1` API beyond the native repositories': its jobs
(a job and its `openai_jobs` row, if it was created through `/v1`), listed newest first after a cursor,
and a job's metric points for its events, checkpoints and result file.

`OpenAIRepository(session, owner)` reads through `_readable()`, the one place the owner filter is applied
(the same filter as `JobRepository._readable`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from sqlalchemy import Select, select
from sqlalchemy.orm import defer

from ftq.store.events import EventRepository
from ftq.store.models import Job, JobEvent, MetricPoint, OpenAIJob
from ftq.store.owned import OwnedRepository


class OpenAIRepository(OwnedRepository):
    model = Job

    def _select(self) -> Select[Any]:
        return cast(Select[Any], select(Job, OpenAIJob).outerjoin(OpenAIJob, OpenAIJob.job_id == Job.id))

    def get(self, job_id: str) -> tuple[Job, OpenAIJob | None] | None:
        row = self.session.execute(self._readable().where(Job.id == job_id)).first()
        return (row[0], row[1]) if row is not None else None

    def page(
        self, *, after: str | None, limit: int, metadata: Mapping[str, str] | None = None
    ) -> tuple[list[tuple[Job, OpenAIJob | None]], bool]:
        """Up to `limit` jobs newest first after the job `after` (none: from the newest), and whether more
        follow. A metadata filter keeps jobs whose metadata holds every pair (read in Python: the JSON
        query differs per store), so a filtered page may scan past `limit` rows."""
        stmt = self._readable()
        if after is not None:
            seq = self.session.scalar(select(Job.seq).where(Job.owner == self.owner, Job.id == after))
            if seq is None:
                return [], False
            stmt = stmt.where(Job.seq < seq)
        # The plan (rendered config and scripts) is not part of a listed job: not read at all.
        stmt = stmt.order_by(Job.seq.desc()).options(defer(Job.plan, raiseload=True))
        if not metadata:
            rows: list[tuple[Job, OpenAIJob | None]] = [
                (r[0], r[1]) for r in self.session.execute(stmt.limit(limit + 1))
            ]
            return rows[:limit], len(rows) > limit
        found: list[tuple[Job, OpenAIJob | None]] = []
        for job, extra in self.session.execute(stmt.execution_options(yield_per=200)):
            held = (extra.job_metadata if extra is not None else None) or {}
            if all(held.get(k) == v for k, v in metadata.items()):
                if len(found) == limit:
                    return found, True
                found.append((job, extra))
        return found, False

    def add(self, row: OpenAIJob) -> None:
        self.session.add(row)
        self.session.flush()

    def points(self, job_id: str) -> list[MetricPoint]:
        """The job's metric points by step (the caller has read the job through `get`)."""
        stmt = (
            select(MetricPoint)
            .join(Job, Job.id == MetricPoint.job_id)
            .where(Job.owner == self.owner, MetricPoint.job_id == job_id)
            .order_by(MetricPoint.step)
        )
        return list(self.session.scalars(stmt))

    def events(self, job_id: str) -> list[JobEvent]:
        """The job's events, oldest first."""
        return EventRepository(self.session, self.owner).page(after=0, limit=100_000, job_id=job_id)

    def succeeded(self, limit: int = 1000) -> list[tuple[Job, OpenAIJob | None]]:
        """The owner's succeeded jobs, newest first: their fine-tuned models."""
        stmt = (
            self._readable()
            .where(Job.status == "succeeded")
            .order_by(Job.seq.desc())
            .limit(limit)
            .options(defer(Job.plan, raiseload=True))
        )
        return [(r[0], r[1]) for r in self.session.execute(stmt)]
