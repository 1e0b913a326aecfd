"""service/jobs/phase.py in process: a job's phase and message before its first step and after its last
come from the newest record of its progress.jsonl (ftq.contract.progress), not from train.log's
wording; a run from before the records (no progress.jsonl) is read the old way, from its log."""

from __future__ import annotations

from pathlib import Path

from ftq.contract import progress, runs
from ftq.contract.progress import RunPhase
from ftq.store.models import Job
from service.jobs.phase import Phase, phase_of, run_phase

JOB_ID = "job_0123456789abcdef"
FETCH = (
    "fetching owner/model: 0 of 16060522496 bytes (7 files)\n"
    "fetching owner/model: 4976698672 of 16060522496 bytes\n"
)
STRATEGY = "trainer INFO strategy none (DistributedType.NO), 1 process(es), device cpu\n"


def _job(status: str = "running", step: int | None = None, max_steps: int | None = None) -> Job:
    return Job(id=JOB_ID, status=status, progress_step=step, progress_max_steps=max_steps)


def test_the_newest_record_is_the_phase(tmp_path: Path) -> None:
    run_dir = runs.run_dir(tmp_path, JOB_ID)
    run_dir.mkdir()
    records = run_dir / runs.PROGRESS
    assert phase_of(_job(), 1, tmp_path) == Phase("starting", "starting 1 process")  # nothing yet
    records.write_text("")
    # The log's wording says something else: only the records count for a run that writes them.
    (run_dir / runs.TRAIN_LOG).write_text(FETCH + STRATEGY + "trained to step 3 in 1.0s\n")
    assert phase_of(_job(), 1, tmp_path) == Phase("starting", "starting 1 process")
    progress.append(records, progress.fetching("owner/model", 4976698672, 16060522496))
    assert phase_of(_job(), 1, tmp_path) == Phase("fetching", "fetching owner/model: 4.6 GiB of 15.0 GiB")
    for message in (progress.LOADING_INPUTS, progress.PREPARING_TRAINER, progress.RESUMING):
        progress.append(records, progress.record(RunPhase.loading, message))
        assert phase_of(_job(), 1, tmp_path) == Phase("loading", message)
    # Once a step is ingested, the run trains (a resumed run's step is its checkpoint's until then).
    assert phase_of(_job(step=3, max_steps=8), 1, tmp_path) == Phase("training", None)
    progress.append(records, progress.record(RunPhase.saving, progress.SAVING_FINAL, step=8, max_steps=8))
    assert phase_of(_job(step=8, max_steps=8), 1, tmp_path) == Phase("saving", "saving the final model")
    # An ended job has no phase, whatever its records say.
    assert phase_of(_job("succeeded", 8, 8), 1, tmp_path) == Phase(None, None)


def test_a_run_without_records_is_read_from_its_old_log_wording(tmp_path: Path) -> None:
    log = tmp_path / runs.TRAIN_LOG
    log.write_text(FETCH)
    assert run_phase(tmp_path) == Phase("fetching", "fetching owner/model: 4.6 GiB of 15.0 GiB")
    log.write_text("fetching owner/tiny: 996 of 547402 bytes\n")
    assert run_phase(tmp_path) == Phase("fetching", "fetching owner/tiny: 996 bytes of 534.6 KiB")
    # Once the ranks run, the trainer's markers say where the run is.
    log.write_text(FETCH + STRATEGY)
    assert run_phase(tmp_path) == Phase("loading", "loading the tokenizer, dataset and model")
    log.write_text(FETCH + STRATEGY + "trainer INFO trained to step 3 in 1.0s\n")
    assert run_phase(tmp_path) == Phase("saving", "saving the final model")
    # With a progress.jsonl, the log is not read at all.
    progress.append(tmp_path / runs.PROGRESS, progress.record(RunPhase.loading, progress.LOADING_INPUTS))
    assert run_phase(tmp_path) == Phase("loading", progress.LOADING_INPUTS)


def test_a_started_job_without_a_record_yet_says_how_many_processes_start() -> None:
    for world, message in ((2, "starting 2 processes"), (1, "starting 1 process")):
        assert phase_of(_job("starting"), world, None) == Phase("starting", message)
