"""A job's samples (greedy completions of its spec's `eval.sample_prompts` during training) as the API
pages them: whole steps after `after_step`, every prompt of a step on the same page."""

from __future__ import annotations

from ftq.contract.schemas import SamplePublic, SamplesPage
from ftq.contract.status import TERMINAL, JobStatus
from ftq.store.repository import JobRepository
from service.errors import NotFound


def samples_page(repo: JobRepository, job_id: str, *, after_step: int, steps: int) -> SamplesPage:
    found = repo.samples_after(job_id, after_step=after_step, steps=steps)
    if found is None:
        raise NotFound(f"job {job_id} not found")
    job, rows = found
    data = [
        SamplePublic(
            step=r.step,
            index=r.prompt_index,
            prompt=r.prompt,
            completion=r.completion,
            time=r.time,
            reward=r.reward,
        )
        for r in rows
    ]
    page_steps = len({r.step for r in rows})
    terminal = JobStatus(job.status) in TERMINAL
    return SamplesPage(
        data=data,
        next_after_step=rows[-1].step if rows else after_step,
        complete=terminal and page_steps < steps,
    )
