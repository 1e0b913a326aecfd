"""The rules of the jobs API: validate, preflight, create, cancel, and read a job's run directory."""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
from collections import OrderedDict
from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

import pydantic_core
from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ftq import runs
from ftq.settings import Settings
from ftq.spec import JobSpec, SpecFieldError, looks_local
from service.db import AsyncReadPool, get_engine
from service.errors import Conflict, NotFound, SpecError, TooManyRequests, spec_field_error
from service.jobs import repository
from service.jobs.repository import POINT_FIELDS, JobRepository, MetricsPoll, utcnow
from service.jobs.schemas import (
    TERMINAL,
    Checkpoint,
    JobError,
    JobPublic,
    JobStatus,
    LogChunk,
    PlanPublic,
    Point,
    Progress,
)
from service.models import Job
from service.paths import PathRefused, refuse_ftq_state, resolve_local
from service.redact import redact

LOG_CHUNK_MAX = 1_048_576


# Validation -------------------------------------------------------------------------------------------


def parse_spec(body: Any) -> JobSpec:
    if not isinstance(body, dict):
        raise spec_field_error([], "the body must be a JSON or YAML object (a job spec)", "type_error")
    try:
        return JobSpec.model_validate(body)
    except ValidationError as exc:
        raise SpecError(_errors_from(exc)) from None


def _errors_from(exc: ValidationError) -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = []
    for err in exc.errors(include_url=False):
        loc = list(err.get("loc", ()))
        msg = err.get("msg", "invalid")
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, SpecFieldError):
            # Cross-field rules name the field they are about; pydantic alone would point at the model.
            loc = [*loc, *cause.loc]
            msg = cause.message
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        errors.append({"loc": ["body", *loc], "msg": msg, "type": err.get("type", "value_error")})
    return errors


def resolve_paths(spec: JobSpec, settings: Settings, repo: JobRepository) -> JobSpec:
    """Local model and dataset paths become absolute, symlink-free paths under the allowed roots,
    outside ftq's own state and other owners' run directories."""
    roots = settings.allowed_roots
    resolved = spec.model_copy(deep=True)
    for section in ("model", "dataset"):
        part = getattr(resolved, section)
        try:
            original = part.name_or_path
            part.name_or_path = resolve_local(original, roots)
            if looks_local(original):
                refuse_ftq_state(
                    part.name_or_path,
                    data_dir=settings.data_path,
                    runs_dir=settings.runs_dir,
                    own_run=lambda job_id: repo.get(job_id) is not None,
                )
        except PathRefused as exc:
            raise spec_field_error([section, "name_or_path"], str(exc), "path_refused") from None
    return resolved


def preflight(spec: JobSpec, settings: Settings) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The memory and disk estimate for the plan, and the refusals it implies (empty when it fits)."""
    from worker import estimate as est

    config, reason = est.load_model_config(spec.model.name_or_path)
    device_bytes = settings.gpu_memory_bytes_for(spec.resources.slurm.partition or settings.slurm_partition)
    refusals: list[dict[str, Any]] = []
    # A folder without weights would fail in the trainer after the queue; say so now (a dry run still
    # answers with the plan, since the estimate needs only config.json).
    problem = est.local_model_problem(spec.model.name_or_path)
    if problem:
        refusals.append({"loc": ["body", "model", "name_or_path"], "msg": problem, "type": "model_error"})
    if config is None:
        return {
            "per_device_bytes": None,
            "device_memory_bytes": device_bytes,
            "fits": None,
            "breakdown": {},
            "reason": reason,
        }, refusals
    estimate = est.estimate_memory(spec, config, device_memory_bytes=device_bytes)
    if spec.resources.device == "cuda" and estimate.get("fits") is False and not spec.allow_oversubscribe:
        fix = est.suggest_fix(spec, config, device_bytes)
        need = estimate["per_device_bytes"] / 1024**3
        have = device_bytes / 1024**3
        msg = f"estimated {need:.1f} GiB per GPU does not fit {have:.0f} GiB"
        msg += f"; {fix}" if fix else ""
        msg += " (set allow_oversubscribe: true to launch anyway)"
        refusals.append({"loc": ["body", "resources"], "msg": msg, "type": "does_not_fit"})
    disk = est.estimate_disk(spec, config)
    estimate["disk"] = disk
    settings.runs_dir.mkdir(parents=True, exist_ok=True)
    import shutil

    free = shutil.disk_usage(settings.runs_dir).free
    estimate["disk"]["free_bytes"] = free
    need_disk = int(disk.get("total_bytes") or 0)
    if need_disk > free and not spec.allow_oversubscribe:
        refusals.append(
            {
                "loc": ["body", "training", "save_steps"],
                "msg": f"checkpoints and final model need about {need_disk / 1024**3:.1f} GiB but "
                f"{free / 1024**3:.1f} GiB is free where runs are stored; raise save_steps or set "
                "save_total_limit",
                "type": "disk_full",
            }
        )
    return estimate, refusals


def _resume_checkpoint(spec: JobSpec, repo: JobRepository, settings: Settings) -> str | None:
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


def new_job_id() -> str:
    return "job_" + secrets.token_hex(8)


def request_hash(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# Create --------------------------------------------------------------------------------------------------


def plan_for(
    body: Any, repo: JobRepository, settings: Settings, *, job_id: str
) -> tuple[JobSpec, dict[str, Any]]:
    spec = resolve_paths(parse_spec(body), settings, repo)
    resume = _resume_checkpoint(spec, repo, settings)
    estimate, refusals = preflight(spec, settings)
    if refusals:
        raise SpecError(refusals)
    from worker.render import render_plan

    plan = render_plan(
        spec,
        job_id=job_id,
        run_dir=runs.run_dir(settings.runs_dir, job_id),
        settings=settings,
        estimate=estimate,
        resume_from_checkpoint=resume,
    )
    return spec, plan.model_dump(mode="json")


def dry_run(body: Any, repo: JobRepository, settings: Settings) -> PlanPublic:
    spec = resolve_paths(parse_spec(body), settings, repo)
    resume = _resume_checkpoint(spec, repo, settings)
    # A dry run always answers with the plan, fits or not, so the user can see why.
    estimate, _ = preflight(spec, settings)
    from worker.render import render_plan

    plan = render_plan(
        spec,
        job_id="dry-run",
        run_dir=runs.run_dir(settings.runs_dir, "dry-run"),
        settings=settings,
        estimate=estimate,
        resume_from_checkpoint=resume,
    )
    return PlanPublic.model_validate(plan.model_dump(mode="json"))


def create_job(
    session: Session, repo: JobRepository, settings: Settings, body: Any, idempotency_key: str | None
) -> tuple[Job, bool]:
    """Returns (job, replayed). The job row and its dispatch record commit together."""
    job_id = new_job_id()
    spec, plan = plan_for(body, repo, settings, job_id=job_id)

    if repo.count_active() >= settings.max_active_jobs_per_owner:
        raise TooManyRequests(
            f"{repo.owner} already has {settings.max_active_jobs_per_owner} jobs queued or running; "
            "wait for some to finish",
            retry_after=30,
        )

    digest = request_hash(body)
    if idempotency_key is not None:
        replay = _claim_idempotency(session, repo, idempotency_key, digest, settings)
        if replay is not None:
            return replay, True

    now = utcnow()
    job = Job(
        id=job_id,
        name=spec.display_name[:64],
        owner=repo.owner,
        status=JobStatus.queued,
        spec=spec.model_dump(mode="json"),
        plan=plan,
        launcher=spec.resources.launcher,
        device=spec.resources.device,
        created_at=now,
        updated_at=now,
        attempt=0,
        metrics_offset=0,
        progress_max_steps=spec.training.max_steps,
    )
    try:
        repo.add_with_dispatch(job)
        if idempotency_key is not None:
            row = repo.get_idempotency(idempotency_key)
            assert row is not None
            row.job_id = job.id
        session.commit()
    except BaseException:
        session.rollback()
        if idempotency_key is not None:
            repo.drop_idempotency(idempotency_key)
            session.commit()
        raise
    return job, False


def _claim_idempotency(
    session: Session, repo: JobRepository, key: str, digest: str, settings: Settings
) -> Job | None:
    """Reserve the key (committed at once, so a concurrent duplicate sees it) or return the first job."""
    for _ in range(2):
        existing = repo.get_idempotency(key)
        if (
            existing is not None
            and existing.expires_at.replace(tzinfo=existing.expires_at.tzinfo or utcnow().tzinfo) < utcnow()
        ):
            repo.drop_idempotency(key)
            session.commit()
            existing = None
        if existing is not None:
            if existing.request_hash != digest:
                raise SpecError(
                    [
                        {
                            "loc": ["header", "Idempotency-Key"],
                            "msg": "this Idempotency-Key was used with a different request body",
                            "type": "idempotency_mismatch",
                        }
                    ]
                )
            if existing.job_id is None:
                raise Conflict("a request with this Idempotency-Key is still being processed; retry shortly")
            job = repo.get(existing.job_id)
            if job is None:
                raise NotFound("the job created with this Idempotency-Key no longer exists")
            return job
        try:
            repo.reserve_idempotency(key, digest, timedelta(hours=settings.idempotency_ttl_hours))
            session.commit()
            return None
        except IntegrityError:
            session.rollback()
    raise Conflict("a request with this Idempotency-Key is still being processed; retry shortly")


# Reads -----------------------------------------------------------------------------------------------------


class _SpecCache:
    """Validated specs by job id. A job's spec never changes after it is stored, and validating it again
    for every job of every list poll was a quarter of `GET /jobs` (py-spy)."""

    def __init__(self, size: int = 4096):
        self._size = size
        self._specs: OrderedDict[str, JobSpec] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, job: Job) -> JobSpec:
        with self._lock:
            spec = self._specs.get(job.id)
            if spec is not None:
                self._specs.move_to_end(job.id)
                return spec
        spec = JobSpec.model_validate(job.spec)
        with self._lock:
            self._specs[job.id] = spec
            while len(self._specs) > self._size:
                self._specs.popitem(last=False)
        return spec


_spec_cache = _SpecCache()


def to_public(job: Job) -> JobPublic:
    error = None
    if job.error_code:
        # Stored redacted; masked again in case the secret was set after the job ended.
        message = redact(job.error_message or "")
        error = JobError(code=job.error_code, message=message, exit_code=job.exit_code)  # type: ignore[arg-type]
    return JobPublic(
        id=job.id,
        name=job.name,
        owner=job.owner,
        status=JobStatus(job.status),
        spec=_spec_cache.get(job),
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        launcher=job.launcher,
        external_id=job.external_id,
        progress=Progress(
            step=job.progress_step,
            max_steps=job.progress_max_steps,
            epoch=job.progress_epoch,
            eta_seconds=job.eta_seconds,
        ),
        latest_metrics=Point.model_validate(job.latest_metrics) if job.latest_metrics else None,
        error=error,
    )


def get_or_404(repo: JobRepository, job_id: str) -> Job:
    job = repo.get(job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def cancel(session: Session, repo: JobRepository, job_id: str) -> Job:
    job = get_or_404(repo, job_id)
    new_status = repository.request_cancel(session, job.id)
    session.commit()
    if new_status is not None:
        session.refresh(job)
    return job


def run_dir_of(job: Job, settings: Settings) -> Path:
    return runs.run_dir(settings.runs_dir, job.id)


def read_log(job: Job, settings: Settings, *, offset: int, limit: int, secrets_: list[str]) -> LogChunk:
    """Bytes [offset, offset+limit) of train.log, cut back to a whole UTF-8 character, secrets masked.

    A chunk holds at least one whole character when one is there, so a small `limit` still moves on.
    A secret is masked even when the chunk holds only part of it: the bytes around the chunk are read
    too, and every byte of the chunk that lies inside a secret becomes part of a `***`.
    """
    path = run_dir_of(job, settings) / runs.TRAIN_LOG
    limit = max(1, min(limit, LOG_CHUNK_MAX))
    terminal = JobStatus(job.status) in TERMINAL
    needles = sorted({v.encode() for v in secrets_ if v})
    pad = max((len(n) for n in needles), default=1) - 1
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            start = min(offset, size)
            before = max(0, start - pad)
            f.seek(before)
            # `pad` bytes either side find secrets across the chunk's edges; 3 more end a character.
            window = f.read(start - before + limit + 3 + pad)
    except FileNotFoundError:
        return LogChunk(offset=offset, next_offset=offset, text="", complete=terminal)
    at = start - before
    data = window[at : at + limit]
    # A live log may end inside a character that is still being written: leave it for the next read.
    if start + len(data) < size or not terminal:
        data = _trim_partial_utf8(data) or _first_char(window[at : at + 4])
    next_offset = start + len(data) if data else offset
    text = _mask(window, at, len(data), needles).decode("utf-8", errors="replace")
    return LogChunk(
        offset=offset, next_offset=next_offset, text=text, complete=terminal and next_offset >= size
    )


def _trim_partial_utf8(data: bytes) -> bytes:
    # Drop an incomplete multi-byte sequence at the end; the next poll starts on its first byte.
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if b & 0x80 == 0:  # ASCII
            return data
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4
        return data if back >= need else data[:-back]
    return data


def _first_char(data: bytes) -> bytes:
    """The first UTF-8 character of data when it is all there, else b""."""
    if not data:
        return b""
    b = data[0]
    need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
    return data[:need] if len(data) >= need else b""


def _mask(window: bytes, at: int, length: int, needles: list[bytes]) -> bytes:
    """window[at:at+length], each run of bytes inside an occurrence of a needle replaced by `***`."""
    chunk = window[at : at + length]
    spans: list[list[int]] = []
    for needle in needles:
        i = window.find(needle)
        while i != -1:
            lo, hi = max(i, at) - at, min(i + len(needle), at + length) - at
            if lo < hi:
                spans.append([lo, hi])
            i = window.find(needle, i + 1)
    if not spans:
        return chunk
    merged: list[list[int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    out, pos = bytearray(), 0
    for lo, hi in merged:
        out += chunk[pos:lo] + b"***"
        pos = hi
    return bytes(out + chunk[pos:])


_POINT_KEYS = ("step", *POINT_FIELDS)


@lru_cache(maxsize=4)
def _metrics_poll(engine: Engine) -> MetricsPoll:
    return MetricsPoll(engine)


def metrics_page_json(owner: str, job_id: str, *, after_step: int, limit: int) -> tuple[bytes, bool]:
    """The same bytes as MetricsPage(...).model_dump_json(), built from rows without model validation,
    and whether the job is terminal (its points will not change again)."""
    found = _metrics_poll(get_engine()).rows(owner, job_id, after_step, limit)
    return _metrics_page_body(found, job_id, after_step, limit)


async def metrics_page_json_on_loop(
    pool: AsyncReadPool, owner: str, job_id: str, *, after_step: int, limit: int
) -> tuple[bytes, bool]:
    """metrics_page_json() on the event loop (PostgreSQL)."""
    found = await _metrics_poll(get_engine()).rows_on_loop(pool, owner, job_id, after_step, limit)
    return _metrics_page_body(found, job_id, after_step, limit)


def _metrics_page_body(
    found: tuple[str, list[Any]] | None, job_id: str, after_step: int, limit: int
) -> tuple[bytes, bool]:
    if found is None:
        raise NotFound(f"job {job_id} not found")
    status, rows = found
    data = [dict(zip(_POINT_KEYS, r, strict=True)) for r in rows]
    next_after = rows[-1][0] if rows else after_step
    terminal = JobStatus(status) in TERMINAL
    complete = terminal and len(rows) < limit
    # pydantic_core writes floats exactly as the response model would (0.00001, 1e+20).
    return pydantic_core.to_json(
        {"data": data, "next_after_step": next_after, "complete": complete}
    ), terminal


RESUMABLE_MARKERS = ("trainer_state.json",)


def _is_resumable(path: Path) -> bool:
    """Whether the trainer can continue from this checkpoint: model, optimizer, scheduler, RNG and
    trainer state are all there, and each was written to the end (checked against what the trainer
    writes for one process, LoRA, FSDP2 sharded and DeepSpeed ZeRO-3)."""
    try:
        entries = {p.name: p for p in path.iterdir()}
        # Written last by the trainer; a checkpoint cut short (a full disk, a kill) has none or half of one.
        json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False

    def whole(name: str) -> bool:
        p = entries.get(name)
        if p is None:
            return False
        if p.is_dir():
            if name.startswith("global_step"):
                # DeepSpeed: every rank's model and optimizer partitions.
                files = [f.name for f in p.iterdir() if f.stat().st_size > 0]
                return any(f.endswith("model_states.pt") for f in files) and any(
                    f.endswith("optim_states.pt") for f in files
                )
            # torch.distributed.checkpoint (FSDP sharded) writes .metadata after every rank's shards.
            return (p / ".metadata").is_file()
        return p.stat().st_size > 0

    names = [n for n in entries if whole(n)]
    has_scheduler = "scheduler.pt" in names
    has_rng = any(n.startswith("rng_state") for n in names)
    # The optimizer is a file (one process, DDP, FSDP full), a folder (FSDP sharded) or ZeRO's global_stepN.
    has_optimizer = any(n.startswith(("optimizer", "global_step")) for n in names)
    has_model = any(
        n.startswith(("adapter_model", "model", "pytorch_model", "pytorch_model_fsdp", "global_step"))
        for n in names
    )
    if "latest" in entries and not any(n.startswith("global_step") for n in names):
        return False  # DeepSpeed's pointer to partitions that are missing or incomplete
    return has_scheduler and has_rng and has_optimizer and has_model


def list_checkpoints(job: Job, settings: Settings) -> list[Checkpoint]:
    root = run_dir_of(job, settings) / runs.CHECKPOINTS
    out: list[Checkpoint] = []
    if not root.is_dir():
        return out
    for child in root.iterdir():
        name = child.name
        if not child.is_dir() or not name.startswith("checkpoint-"):
            continue
        try:
            step = int(name.split("-", 1)[1])
        except ValueError:
            continue
        out.append(Checkpoint(step=step, path=str(child), resumable=_is_resumable(child)))
    return sorted(out, key=lambda c: c.step)
