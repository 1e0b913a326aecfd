"""Tail each active run's metrics.jsonl and samples.jsonl into the store.

Reading starts at the job's stored byte offset and takes only complete lines: a line the trainer is
still writing waits for the next pass. Points are upserted by (job, step) and samples by (job, step,
prompt index), so a pass that runs twice (two schedulers, a retried task) stores the same thing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from datetime import UTC, datetime
from typing import Any

from ftq.contract import runs
from ftq.contract.events import EventType
from ftq.contract.metrics import EXTRA_NAME_RE, MAX_EXTRA, POINT_FIELDS
from ftq.contract.status import JobStatus
from ftq.runtime import logs
from ftq.runtime.redact import redact
from ftq.runtime.settings import get_settings
from ftq.store import events, repository
from ftq.store.db import session_scope
from ftq.store.models import Job

log = logging.getLogger(__name__)

MAX_READ = 1024 * 1024
_EXTRA_NAME = re.compile(EXTRA_NAME_RE)
INGESTING = (JobStatus.running, JobStatus.cancelling)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    # NaN/inf cannot be sent as JSON; a diverged loss shows as null rather than breaking every read.
    return f if math.isfinite(f) else None


def _extra(value: Any) -> dict[str, float] | None:
    """The method metrics of a line: names as TRL writes them, finite numbers, at most MAX_EXTRA (the
    run writes the file, so anything else in it is dropped)."""
    if not isinstance(value, dict):
        return None
    out: dict[str, float] = {}
    for name, v in value.items():
        number = _number(v)
        if number is not None and isinstance(name, str) and _EXTRA_NAME.match(name):
            out[name] = number
            if len(out) >= MAX_EXTRA:
                break
    return out or None


def _json_object(line: bytes) -> dict[str, Any] | None:
    """The object a JSON Lines line holds, else None (the run writes these files: anything may be in them)."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def parse_point(line: bytes) -> dict[str, Any] | None:
    obj = _json_object(line)
    if obj is None:
        return None
    step = obj.get("step")
    if isinstance(step, bool) or not isinstance(step, int | float) or not math.isfinite(step):
        return None
    point: dict[str, Any] = {"step": int(step)}
    for f in POINT_FIELDS:
        point[f] = _number(obj.get(f))
    extra = _extra(obj.get("extra"))
    if extra:
        point["extra"] = extra
    if isinstance(obj.get("max_steps"), int) and not isinstance(obj.get("max_steps"), bool):
        point["max_steps"] = obj["max_steps"]
    return point


def read_new_lines(path: Any, offset: int) -> tuple[list[bytes], int]:
    """Complete lines from `offset`, and the offset just past the last one read.

    The run writes its run directory, so the file is the run's to choose: a symlink (to another owner's
    metrics, or anything the worker may read) or a FIFO (an open that never returns) is read as empty."""
    try:
        fd, size = runs.open_regular(path)
        with os.fdopen(fd, "rb") as f:
            if size <= offset:
                return [], offset
            f.seek(offset)
            data = f.read(min(MAX_READ, size - offset))
    except OSError:  # missing, a symlink (ELOOP), a FIFO, unreadable
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    return data[: end + 1].splitlines(), offset + end + 1


def _latest(previous: dict[str, Any] | None, points: list[dict[str, Any]]) -> dict[str, Any]:
    newest = max(p["step"] for p in points)
    merged: dict[str, Any] = {}
    if previous and previous.get("step") == newest:
        merged.update(previous)
    merged["step"] = newest
    for p in points:
        if p["step"] != newest:
            continue
        for f in POINT_FIELDS:
            if p.get(f) is not None:
                merged[f] = p[f]
    for f in POINT_FIELDS:
        merged.setdefault(f, None)
    return merged


def _eta(job: Job, step: int, max_steps: int | None, points: list[dict[str, Any]]) -> float | None:
    if not max_steps or step <= 0:
        return None
    if step >= max_steps:
        return 0.0
    # Rate from recent points (the trainer's clock); else the whole run's average since it started.
    timed = [(int(p["step"]), float(p["time"])) for p in points if p.get("time") is not None]
    prev = job.latest_metrics or {}
    if prev.get("time") is not None and prev.get("step") is not None:
        timed.insert(0, (int(prev["step"]), float(prev["time"])))
    timed.sort()
    rate = None
    if len(timed) >= 2 and timed[-1][0] > timed[0][0] and timed[-1][1] > timed[0][1]:
        rate = (timed[-1][0] - timed[0][0]) / (timed[-1][1] - timed[0][1])
    elif job.started_at is not None:
        started = job.started_at if job.started_at.tzinfo else job.started_at.replace(tzinfo=UTC)
        elapsed = (datetime.now(UTC) - started).total_seconds()
        if elapsed > 0:
            rate = step / elapsed
    if not rate:
        return job.eta_seconds
    return round((max_steps - step) / rate, 1)


# What the run wrote is the run's to choose: anything longer than these is cut, not stored whole.
SAMPLE_TEXT_LIMIT = 16384
MAX_SAMPLE_INDEX = 1024


def _whole(value: Any) -> int | None:
    """A non-negative int (not a bool, not a float), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def parse_sample(line: bytes) -> dict[str, Any] | None:
    """A samples.jsonl line as {step, index, prompt, completion, time, reward}, or None when it is not
    one (`reward`: a GRPO rollout's, else None)."""
    obj = _json_object(line)
    if obj is None:
        return None
    step, index = _whole(obj.get("step")), _whole(obj.get("index"))
    if step is None or index is None or index >= MAX_SAMPLE_INDEX or step > 2**31 - 1:
        return None
    prompt, completion = obj.get("prompt"), obj.get("completion")
    if not isinstance(prompt, str) or not isinstance(completion, str):
        return None
    return {
        "step": step,
        "index": index,
        # NUL cannot be stored in a PostgreSQL text column.
        "prompt": prompt[:SAMPLE_TEXT_LIMIT].replace("\x00", ""),
        "completion": completion[:SAMPLE_TEXT_LIMIT].replace("\x00", ""),
        "time": _number(obj.get("time")),
        "reward": _number(obj.get("reward")),
    }


def ingest_samples(session: Any, job: Job, runs_dir: Any) -> int:
    """The job's new samples.jsonl lines into the store, each batch committed with its offset."""
    path = runs.run_dir(runs_dir, job.id) / runs.SAMPLES
    offset = job.samples_offset or 0
    total = 0
    while True:
        lines, new_offset = read_new_lines(path, offset)
        if new_offset == offset:
            return total
        nonblank = [ln for ln in lines if ln.strip()]
        samples = [s for s in (parse_sample(ln) for ln in nonblank) if s is not None]
        if len(samples) < len(nonblank):
            log.warning("job %s: skipped malformed samples lines before byte %s", job.id, new_offset)
        repository.upsert_samples(session, job.id, samples)
        repository.update_samples_offset(session, job.id, new_offset)
        session.commit()
        total += len(samples)
        offset = new_offset


@logs.about_job
def ingest_job(job_id: str) -> int:
    """One pass over one job's new metric and sample lines; returns how many points were stored."""
    settings = get_settings()
    total = 0
    with session_scope() as session:
        job = repository.get_job(session, job_id)
        if job is None:
            return 0
        ingest_samples(session, job, settings.runs_dir)
        session.refresh(job)
        path = runs.run_dir(settings.runs_dir, job.id) / runs.METRICS
        offset = job.metrics_offset or 0
        while True:
            lines, new_offset = read_new_lines(path, offset)
            if new_offset == offset:
                break
            points = [p for p in (parse_point(ln) for ln in lines if ln.strip()) if p is not None]
            if len(points) < len([ln for ln in lines if ln.strip()]):
                log.warning("job %s: skipped malformed metrics lines before byte %s", job.id, new_offset)
            step = max_steps = epoch = eta = latest = None
            for p in points:
                if p.get("eval_loss") is not None:
                    # Keyed by step: a line read again (a crash before its offset committed) is one event.
                    evaluated = {"eval_loss": p["eval_loss"]}
                    events.record(
                        session,
                        job.id,
                        EventType.eval,
                        {"step": p["step"], "metrics": evaluated},
                        key=f"eval:{p['step']}",
                        owner=job.owner,
                    )
            if points:
                repository.upsert_points(
                    session, job.id, [{k: v for k, v in p.items() if k != "max_steps"} for p in points]
                )
                latest = _latest(job.latest_metrics, points)
                step = latest["step"]
                if job.progress_step is not None and job.progress_step > step:
                    step = job.progress_step
                declared = [p["max_steps"] for p in points if p.get("max_steps")]
                spec_steps = ((job.spec or {}).get("training") or {}).get("max_steps")
                max_steps = declared[-1] if declared else (job.progress_max_steps or spec_steps)
                epoch = latest.get("epoch")
                eta = _eta(job, step, max_steps, points)
            repository.update_progress(
                session,
                job.id,
                metrics_offset=new_offset,
                step=step,
                max_steps=max_steps,
                epoch=epoch,
                eta_seconds=eta,
                latest=latest,
            )
            # Each batch's points and its offset commit together: a catch-up over a long file shows
            # points as it goes (ingest lag), and a crash mid-way resumes at the last committed batch.
            session.commit()
            session.refresh(job)
            total += len(points)
            offset = new_offset
        seen = run_events(session, job, runs.run_dir(settings.runs_dir, job.id))
        session.commit()
        _seen.update(seen)  # after the commit: a pass that failed reads the files again
    return total


# The sizes of the run files last turned into events, per job: a file that did not change is not read
# again. Only a shortcut: the events' keys are what keeps a re-read from recording anything twice.
_seen: dict[tuple[str, str], int] = {}
SIDE_FILE_LIMIT = 4 * 1024 * 1024
# The run writes these files: however many lines it writes, a job gets at most this many events of each.
MAX_SIDE_EVENTS = 1000


def run_events(session: Any, job: Job, run_dir: Any) -> dict[tuple[str, str], int]:
    """Events from what the run directory shows: each complete checkpoint (job.checkpoint), each line of
    warnings.jsonl (job.warning) and of samples.jsonl (job.sample). Keyed, so a pass that reads them
    again records nothing new. Returns the file sizes read, for `_seen` once committed."""
    seen: dict[tuple[str, str], int] = {}
    recorded = events.keys_with_prefix(session, job.id, "checkpoint:")
    root = run_dir / runs.CHECKPOINTS
    try:
        children = list(root.iterdir()) if root.is_dir() else []
    except OSError:
        children = []
    for child in sorted(children, key=lambda c: runs.checkpoint_step(c) or -1):
        step = runs.checkpoint_step(child)
        if step is None or f"checkpoint:{step}" in recorded or child.is_symlink() or not child.is_dir():
            continue
        if not runs.is_resumable(child):
            continue  # still being written (or cut short): a later pass sees it complete
        events.record(
            session,
            job.id,
            EventType.checkpoint,
            {"step": step, "path": str(child.relative_to(run_dir))},
            key=f"checkpoint:{step}",
            owner=job.owner,
        )
    for name, type_, prefix in (
        (runs.WARNINGS, EventType.warning, "warning:"),
        (runs.SAMPLES, EventType.sample, "sample:"),
    ):
        for index, obj in _new_lines(job.id, run_dir / name, seen):
            if index >= MAX_SIDE_EVENTS:
                break
            data = _side_event_data(type_, obj)
            if data is not None:
                events.record(session, job.id, type_, data, key=f"{prefix}{index}", owner=job.owner)
    return seen


def _new_lines(job_id: str, path: Any, seen: dict[tuple[str, str], int]) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of every JSON line of a run file that changed since the last look."""
    try:
        fd, size = runs.open_regular(path)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        if _seen.get((job_id, path.name)) == size:
            return []
        data = f.read(SIDE_FILE_LIMIT)
    end = data.rfind(b"\n")
    if end < 0:
        return []
    # A torn last line (the run is writing it) leaves the size unmatched: the next pass reads again.
    seen[(job_id, path.name)] = end + 1 if end + 1 < size else size
    out = []
    for index, line in enumerate(data[: end + 1].splitlines()):
        obj = _json_object(line)
        if obj is not None:
            out.append((index, obj))
    return out


def _text(value: Any, limit: int) -> str | None:
    # What the run wrote becomes an event any client of the owner reads: the operator's secrets masked
    # (ftq.runtime.redact), as in every byte of the run directory the API serves.
    return redact(value)[:limit] if isinstance(value, str) else None


def _side_event_data(type_: EventType, obj: dict[str, Any]) -> dict[str, Any] | None:
    step = obj.get("step")
    step = (
        int(step)
        if isinstance(step, int | float) and not isinstance(step, bool) and math.isfinite(step)
        else None
    )
    if type_ == EventType.warning:
        kind = _text(obj.get("kind"), 32) or "warning"
        return {"kind": kind, "step": step, "message": _text(obj.get("message"), 2000) or kind}
    data: dict[str, Any] = {
        "step": step,
        "prompt": _text(obj.get("prompt"), 4000),
        "completion": _text(obj.get("completion"), 8000),
    }
    reward = _number(obj.get("reward"))
    if reward is not None:
        data["reward"] = reward  # a GRPO rollout's
    return data


def ingest_all() -> int:
    with session_scope() as session:
        ids = [j.id for j in repository.jobs_in(session, INGESTING)]
    total = 0
    for job_id in ids:
        try:
            total += ingest_job(job_id)
        except Exception:
            log.exception("ingest of %s failed; the next pass retries", job_id, extra={"job_id": job_id})
    return total
