"""The tracker runs a job made (spec `integrations`), as the API shows them: what the trainer recorded
in the run directory's trackers.json once training started (ftq.contract.runs.TRACKERS)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from ftq.contract import runs
from ftq.contract.schemas import TrackerRun
from ftq.contract.spec import JobSpec
from ftq.contract.status import JobStatus
from ftq.runtime.settings import split_userinfo
from ftq.store.models import Job

RECORD_LIMIT = 64 * 1024  # a few names and URLs; the run wrote it, so it is not read whole if larger
_RECORD = TypeAdapter(dict[str, TrackerRun])


def tracker_runs(job: Job, spec: JobSpec, runs_dir: Path | None) -> dict[str, TrackerRun] | None:
    """The job's tracker runs by tracker name; None without trackers, or before the trainer wrote them."""
    if runs_dir is None or not spec.integrations.report_to or job.status == JobStatus.queued:
        return None
    try:
        data = json.loads(runs.read_run_file(runs.run_dir(runs_dir, job.id) / runs.TRACKERS, RECORD_LIMIT))
        found = _RECORD.validate_python(data)
    except (OSError, ValueError, ValidationError):  # not there yet, not a regular file, not a record
        return None
    # Only the trackers this job asked for: the file is the run's, and may say anything. A URL is shown
    # without credentials (a run launched before they were kept out of its environment may hold them).
    return {
        name: run.model_copy(update={"url": split_userinfo(run.url)[0] if run.url else run.url})
        for name, run in found.items()
        if name in spec.integrations.report_to
    } or None
