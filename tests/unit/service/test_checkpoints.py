"""The API's checkpoint list and `resume_from` (service/jobs/checkpoints.py) on run dirs of the test's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from ftq.contract import runs
from ftq.contract.spec import JobSpec
from ftq.runtime.settings import Settings
from ftq.store.models import Job
from ftq.store.repository import JobRepository
from service.errors import SpecError
from service.jobs.checkpoints import list_checkpoints, resume_checkpoint
from tests.harness.assets import checkpoint_dir

SOURCE = "job_source00000001"


class Jobs:
    """Stands in for JobRepository.get: the jobs this owner can read."""

    def __init__(self, *jobs: Job):
        self.jobs = {j.id: j for j in jobs}

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path)


@pytest.fixture
def repo(settings: Settings) -> JobRepository:
    """A finished job with checkpoints at steps 2 and 4 (resumable) and 6 (cut short)."""
    run_dir = runs.run_dir(settings.runs_dir, SOURCE)
    checkpoint_dir(run_dir, 2)
    checkpoint_dir(run_dir, 4)
    (checkpoint_dir(run_dir, 6) / "trainer_state.json").unlink()
    return cast(JobRepository, Jobs(Job(id=SOURCE, status="succeeded"), Job(id="job_empty", status="failed")))


def spec(**resume: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "model": {"name_or_path": "org/model"},
            "dataset": {"name_or_path": "org/data"},
            "training": {"max_steps": 8},
            "resume_from": resume or None,
        }
    )


def field_error(exc: pytest.ExceptionInfo[SpecError]) -> tuple[list[Any], str]:
    err = exc.value.errors[0]
    return err["loc"], err["msg"]


def test_the_list_says_which_checkpoints_resume(settings: Settings, repo: JobRepository) -> None:
    job = repo.get(SOURCE)
    assert job is not None
    listed = list_checkpoints(job, settings)
    assert [(c.step, c.resumable) for c in listed] == [(2, True), (4, True), (6, False)]
    assert listed[1].path == str(settings.runs_dir / SOURCE / "checkpoints" / "checkpoint-4")
    assert list_checkpoints(Job(id="job_norun", status="queued"), settings) == []


def test_latest_is_the_newest_resumable_checkpoint(settings: Settings, repo: JobRepository) -> None:
    path = resume_checkpoint(spec(job_id=SOURCE), repo, settings)
    assert path == str(settings.runs_dir / SOURCE / "checkpoints" / "checkpoint-4")
    at_2 = resume_checkpoint(spec(job_id=SOURCE, checkpoint=2), repo, settings)
    assert at_2 is not None and at_2.endswith("checkpoint-2")


def test_no_resume_from_is_no_checkpoint(settings: Settings, repo: JobRepository) -> None:
    assert resume_checkpoint(spec(), repo, settings) is None


def test_a_step_that_is_not_resumable_names_the_ones_that_are(
    settings: Settings, repo: JobRepository
) -> None:
    for step in (3, 6):  # absent, and cut short
        with pytest.raises(SpecError) as exc:
            resume_checkpoint(spec(job_id=SOURCE, checkpoint=step), repo, settings)
        loc, msg = field_error(exc)
        assert loc == ["body", "resume_from", "checkpoint"]
        assert f"at step {step}" in msg and "have 2, 4" in msg


def test_an_unknown_job_or_one_without_checkpoints(settings: Settings, repo: JobRepository) -> None:
    with pytest.raises(SpecError) as exc:
        resume_checkpoint(spec(job_id="job_nosuchjob00001"), repo, settings)
    assert field_error(exc) == (["body", "resume_from", "job_id"], "no such job")
    with pytest.raises(SpecError) as exc:
        resume_checkpoint(spec(job_id="job_empty"), repo, settings)
    loc, msg = field_error(exc)
    assert loc == ["body", "resume_from", "job_id"] and "no resumable checkpoint" in msg
