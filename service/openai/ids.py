"""OpenAI's ids for ftq's objects, and back: a job `job_<hex>` is `ftjob-<hex>`, a file `file_<hex>` is
`file-<hex>`, a job's result file is `file-result-<hex>` (made from its metrics when read), its events
`ftevent-<e|m><n>` (an event, or the metrics of a step) and its checkpoints `ftckpt-<hex>-<step>`."""

from __future__ import annotations

import re

_JOB = re.compile(r"^(?:ftjob-|job_)([0-9a-f]{16})$")
_FILE = re.compile(r"^file[-_]([0-9a-f]{24})$")
_RESULT = re.compile(r"^file-result-([0-9a-f]{16})$")


def job_out(native_id: str) -> str:
    return "ftjob-" + native_id.removeprefix("job_")


def job_in(v1_id: str) -> str | None:
    """The native job id of `ftjob-<hex>` (or of a native id), None for anything else."""
    m = _JOB.match(v1_id)
    return f"job_{m.group(1)}" if m else None


def job_hex(native_id: str) -> str:
    return native_id.removeprefix("job_")


def file_out(native_id: str) -> str:
    return "file-" + native_id.removeprefix("file_")


def file_in(v1_id: str) -> str | None:
    m = _FILE.match(v1_id)
    return f"file_{m.group(1)}" if m else None


def result_file_out(native_job_id: str) -> str:
    return "file-result-" + job_hex(native_job_id)


def result_file_job(v1_id: str) -> str | None:
    m = _RESULT.match(v1_id)
    return f"job_{m.group(1)}" if m else None


def checkpoint_out(native_job_id: str, step: int) -> str:
    return f"ftckpt-{job_hex(native_job_id)}-{step}"
