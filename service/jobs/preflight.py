"""Checks made before a job is accepted: local paths resolved inside the allowed roots, and the memory
and disk estimate against what the job asks for."""

from __future__ import annotations

import shutil
from typing import Any

from ftq import estimate as est
from ftq.estimate import Estimate
from ftq.settings import Settings
from ftq.spec import JobSpec, looks_local
from ftq.store.repository import JobRepository
from service.errors import spec_field_error
from service.paths import PathRefused, refuse_ftq_state, resolve_local


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


def preflight(spec: JobSpec, settings: Settings) -> tuple[Estimate, list[dict[str, Any]]]:
    """The memory and disk estimate for the plan, and the refusals it implies (empty when it fits)."""
    config, reason = est.load_model_config(spec.model.name_or_path)
    device_bytes = settings.gpu_memory_bytes_for(spec.resources.slurm.partition or settings.slurm_partition)
    refusals: list[dict[str, Any]] = []
    # A folder without weights would fail in the trainer after the queue; say so now (a dry run still
    # answers with the plan, since the estimate needs only config.json).
    problem = est.local_model_problem(spec.model.name_or_path)
    if problem:
        refusals.append({"loc": ["body", "model", "name_or_path"], "msg": problem, "type": "model_error"})
    if config is None:
        return Estimate(device_memory_bytes=device_bytes, reason=reason), refusals
    estimate = est.estimate_memory(spec, config, device_memory_bytes=device_bytes)
    if spec.resources.device == "cuda" and estimate.fits is False and not spec.allow_oversubscribe:
        fix = est.suggest_fix(spec, config, device_bytes)
        need = (estimate.per_device_bytes or 0) / 1024**3
        have = device_bytes / 1024**3
        msg = f"estimated {need:.1f} GiB per GPU does not fit {have:.0f} GiB"
        msg += f"; {fix}" if fix else ""
        msg += " (set allow_oversubscribe: true to launch anyway)"
        refusals.append({"loc": ["body", "resources"], "msg": msg, "type": "does_not_fit"})
    disk = est.estimate_disk(spec, config)
    settings.runs_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(settings.runs_dir).free
    disk.free_bytes = free
    estimate.disk = disk
    need_disk = disk.total_bytes or 0
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
