"""service/jobs/phase.py in process: the fetch step's lines in train.log read back as the phase
`fetching` with the bytes done, before the trainer's own markers take over."""

from __future__ import annotations

from pathlib import Path

from ftq.store.models import Job
from service.jobs.phase import Phase, _last_marker, phase_of

FETCH = (
    "fetching owner/model: 0 of 16060522496 bytes (7 files)\n"
    "fetching owner/model: 4976698672 of 16060522496 bytes\n"
)


def test_the_fetch_steps_last_line_is_the_phase_with_bytes_done(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(FETCH)
    assert _last_marker(log) == Phase("fetching", "fetching owner/model: 4.6 GiB of 15.0 GiB")
    log.write_text("fetching owner/tiny: 996 of 547402 bytes\n")
    assert _last_marker(log) == Phase("fetching", "fetching owner/tiny: 996 bytes of 534.6 KiB")
    # Once the ranks run, the trainer's markers say where the run is.
    log.write_text(FETCH + "trainer INFO strategy none (DistributedType.NO), 1 process(es), device cpu\n")
    assert _last_marker(log) == Phase("loading", "loading the tokenizer, dataset and model")


def test_a_started_job_without_a_marker_yet_says_how_many_processes_start() -> None:
    for world, message in ((2, "starting 2 processes"), (1, "starting 1 process")):
        job = Job(id="job_0123456789abcdef", status="starting", progress_step=None, progress_max_steps=None)
        assert phase_of(job, world, None) == Phase("starting", message)
