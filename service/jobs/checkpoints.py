"""A job's checkpoints as the API lists them, and the checkpoint a new job resumes from (`resume_from`).
Which folders are checkpoints and which can be resumed is the run layout's rule (`ftq.contract.runs`)."""

from __future__ import annotations

from ftq.contract import runs
from ftq.contract.schemas import Checkpoint
from ftq.contract.spec import JobSpec
from ftq.runtime.settings import Settings
from ftq.store.models import Job
from ftq.store.repository import JobRepository
from service.errors import spec_field_error


def list_checkpoints(job: Job, settings: Settings) -> list[Checkpoint]:
    run_dir = runs.run_dir(settings.runs_dir, job.id)
    return [
        Checkpoint(step=c.step, path=str(c.path), resumable=c.resumable)
        for c in runs.list_checkpoints(run_dir)
    ]


def resume_checkpoint(spec: JobSpec, repo: JobRepository, settings: Settings) -> str | None:
    if spec.resume_from is None:
        return None
    source = repo.get(spec.resume_from.job_id)
    if source is None:
        raise spec_field_error(["resume_from", "job_id"], "no such job", "not_found")
    ckpts = [c for c in list_checkpoints(source, settings) if c.resumable]
    if not ckpts:
        raise spec_field_error(["resume_from", "job_id"], "that job has no resumable checkpoint", "not_found")
    want = spec.resume_from.checkpoint
    if want == "latest":
        return ckpts[-1].path
    for c in ckpts:
        if c.step == want:
            return c.path
    steps = ", ".join(str(c.step) for c in ckpts)
    raise spec_field_error(
        ["resume_from", "checkpoint"], f"no resumable checkpoint at step {want} (have {steps})"
    )
