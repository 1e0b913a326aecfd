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


# Issue 27 (6): a checkpoint is checked at submit against this job's strategy and world size ----------


def sharded_source(settings: Settings, kind: str, ranks: int, distributed: dict[str, Any]) -> JobRepository:
    """A finished job of `ranks` processes under `distributed` with one checkpoint (step 4) of `kind`."""
    checkpoint_dir(runs.run_dir(settings.runs_dir, SOURCE), 4, kind=kind, ranks=ranks)
    source = Job(
        id=SOURCE,
        status="succeeded",
        spec={
            "distributed": distributed,
            "resources": {"device": "cpu", "processes_per_node": ranks},
        },
    )
    return cast(JobRepository, Jobs(source))


def resuming(strategy: dict[str, Any], processes: int, accumulation: int = 1, micro: int = 1) -> JobSpec:
    training = {"per_device_train_batch_size": micro, "gradient_accumulation_steps": accumulation}
    return JobSpec.model_validate(
        {
            "model": {"name_or_path": "org/model"},
            "dataset": {"name_or_path": "org/data"},
            "training": {"max_steps": 8, "mixed_precision": "no", **training},
            "distributed": strategy,
            "resources": {"device": "cpu", "processes_per_node": processes},
            "resume_from": {"job_id": SOURCE},
        }
    )


ZERO3 = {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}}
FSDP2 = {"strategy": "fsdp", "fsdp": {"version": 2}}


def test_zero3_partitions_resume_on_their_world_size_and_are_refused_on_another(settings: Settings) -> None:
    repo = sharded_source(settings, "deepspeed", 4, ZERO3)
    assert resume_checkpoint(resuming(ZERO3, 4), repo, settings) is not None
    with pytest.raises(SpecError) as exc:
        resume_checkpoint(resuming(ZERO3, 2), repo, settings)
    loc, msg = field_error(exc)
    assert loc == ["body", "resume_from"]
    assert "4 processes" in msg and "runs 2" in msg
    # Another ZeRO stage is refused too, at any world size.
    with pytest.raises(SpecError) as exc:
        resume_checkpoint(
            resuming({"strategy": "deepspeed", "deepspeed": {"zero_stage": 2}}, 4), repo, settings
        )
    assert "ZeRO-3" in field_error(exc)[1]


def test_the_world_size_is_read_from_the_checkpoints_own_files(settings: Settings) -> None:
    # The source's spec says 2 processes, its checkpoint's partitions say 4: the files decide.
    repo = sharded_source(settings, "deepspeed", 4, ZERO3)
    job = repo.get(SOURCE)
    assert job is not None
    job.spec["resources"]["processes_per_node"] = 2
    with pytest.raises(SpecError) as exc:
        resume_checkpoint(resuming(ZERO3, 2), repo, settings)
    assert "4 processes" in field_error(exc)[1]


def test_fsdp_sharded_checkpoints_reshard_onto_another_world_size(settings: Settings) -> None:
    # Written by 4 processes of 1 row each: 4 rows a step, which another world size must keep.
    repo = sharded_source(settings, "fsdp", 4, FSDP2)
    for processes, accumulation in ((4, 1), (2, 2), (1, 4)):
        path = resume_checkpoint(resuming(FSDP2, processes, accumulation), repo, settings)
        assert path is not None and path.endswith("checkpoint-4")
    with pytest.raises(SpecError) as exc:
        resume_checkpoint(resuming({"strategy": "fsdp", "fsdp": {"version": 1}}, 4), repo, settings)
    loc, msg = field_error(exc)
    assert loc == ["body", "resume_from"] and "FSDP2" in msg and "FSDP1" in msg


def test_another_world_size_must_keep_the_rows_of_a_step(settings: Settings) -> None:
    # The trainer finds its place in the data by the steps trained: a step of other rows would lose it.
    repo = sharded_source(settings, "fsdp", 4, FSDP2)
    with pytest.raises(SpecError) as exc:
        resume_checkpoint(resuming(FSDP2, 2), repo, settings)
    loc, msg = field_error(exc)
    assert loc == ["body", "resume_from"]
    assert "4 rows a step" in msg and "takes 2" in msg and "gradient_accumulation_steps: 2" in msg
    with pytest.raises(SpecError) as exc:
        resume_checkpoint(resuming(FSDP2, 8), repo, settings)
    assert "x 8 processes = 4" in field_error(exc)[1]


def test_a_checkpoint_resumes_only_under_the_strategy_that_wrote_it(settings: Settings) -> None:
    repo = sharded_source(settings, "fsdp", 2, FSDP2)
    for other in (ZERO3, {"strategy": "ddp"}):
        with pytest.raises(SpecError) as exc:
            resume_checkpoint(resuming(other, 2), repo, settings)
        loc, msg = field_error(exc)
        assert loc == ["body", "resume_from"] and "written under fsdp" in msg


def test_plain_checkpoints_resume_on_any_world_size(settings: Settings, repo: JobRepository) -> None:
    # One process's whole files (the fixture's, 2 rows a step): DDP on 2 processes of 1 row loads them as
    # one process does.
    source = repo.get(SOURCE)
    assert source is not None
    source.spec = {"training": {"per_device_train_batch_size": 2}}
    assert resume_checkpoint(resuming({"strategy": "ddp"}, 2), repo, settings) is not None
    with pytest.raises(SpecError):
        resume_checkpoint(resuming(FSDP2, 2), repo, settings)
