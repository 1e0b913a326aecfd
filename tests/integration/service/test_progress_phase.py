"""The progress phase of a real job through a real `ftq up` (service/jobs/phase.py): a job says what it
is doing before its first step, read from the records the trainer writes to progress.jsonl
(ftq.contract.progress), not from the wording of its train.log."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from ftq.contract import progress, runs
from tests.harness import QUICK_SETTINGS, Deployment, run_ftq, tiny_spec

ORDER = ["queued", "starting", "loading", "training", "saving"]


@pytest.mark.slow  # a real tiny run (one process: the plural of "starting 2 processes" is test_phase.py's)
def test_a_job_says_what_it_does_before_its_first_step(tmp_path: Path, tiny_dir: Path) -> None:
    settings = {**QUICK_SETTINGS, "local_roots": f"{tmp_path / 'data'}:{tiny_dir}"}
    with Deployment(tmp_path, settings=settings) as dep:
        job_id = dep.post_job(tiny_spec(tiny_dir, name="phases", processes=1, max_steps=3))["id"]
        seen: list[tuple[str, str | None, str | None, int | None]] = []
        shown: str | None = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            job = dep.job(job_id)
            p = job["progress"]
            entry = (job["status"], p["phase"], p["message"], p["step"])
            if not seen or seen[-1] != entry:
                seen.append(entry)
            if p["message"] and shown is None:
                # `ftq status` shows it too (the run may have moved on by the time the CLI asks).
                shown = run_ftq("status", job_id, url=dep.url).stdout
            if job["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.1)

    assert seen[-1][0] == "succeeded", (seen, dep.report(job_id))
    assert seen[-1][1] is None and seen[-1][2] is None  # an ended job has no phase
    # Torch alone takes seconds to import in each process: the poll sees the launch, in words.
    assert ("starting", "starting 1 process") in {(s[1], s[2]) for s in seen}, seen
    for status, phase, message, step in seen:
        if status in ("starting", "running") and step is None:
            assert message, seen  # never an empty "what is happening" before the first step
        if phase == "training":
            assert step is not None, seen
    messages = "|".join(re.escape(m) for m in {s[2] for s in seen if s[2]})
    assert shown and re.search(rf"progress\s+(\S+ \(({messages})\)|\d+/3 )", shown), shown
    phases = [s[1] for s in seen if s[1] is not None]
    assert phases == sorted(phases, key=ORDER.index), seen  # forward only

    # What the API said the run was doing is what the run wrote as records, in the order it wrote them.
    lines = (dep.run_dir(job_id) / runs.PROGRESS).read_text().splitlines()
    records = [progress.parse(line) for line in lines]
    assert [(r.phase, r.message) for r in records if r is not None] == [
        ("loading", progress.LOADING_INPUTS),
        ("loading", progress.PREPARING_TRAINER),
        ("saving", progress.SAVING_FINAL),
    ], lines
    assert records[-1] is not None and records[-1].step == records[-1].max_steps == 3, lines
    from_records = {(str(r.phase), r.message) for r in records if r is not None}
    for _, phase, message, _ in seen:
        if message is not None and phase in ("loading", "saving"):
            assert (phase, message) in from_records, seen
