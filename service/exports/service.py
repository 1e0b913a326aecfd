"""The rules of exports: what may be exported (a succeeded job's final/; an adapter only of a LoRA job),
one export per identical request, cancel as a job's, and the shape of an export in responses."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.evaluation import ref_label
from ftq.contract.schemas import (
    ExportCreate,
    ExportDtype,
    ExportKind,
    ExportPublic,
    PushToHub,
)
from ftq.contract.status import JobStatus
from ftq.runtime.settings import Settings
from ftq.store.exports import ExportRepository
from ftq.store.models import Export, ExportQueue
from service import side_runs
from service.errors import Conflict, spec_field_error
from service.evaluations.service import resolve_step


def create(
    session: Session, owner: str, settings: Settings, job_id: str, body: ExportCreate
) -> tuple[Export, bool]:
    """The new export (queued, with its dispatch), or the existing identical one (True)."""
    if body.push_to_hub is not None and not settings.hub_token:
        raise spec_field_error(
            ["push_to_hub"],
            "this server has no Hugging Face token to push with; ask the operator to set FTQ_HUB_TOKEN, or "
            "leave push_to_hub out and download the export",
            "not_configured",
        )
    job = side_runs.job_or_404(session, owner, job_id)
    if job.status != JobStatus.succeeded:
        raise Conflict(
            f"job {job_id} is {job.status}: only a succeeded job has a final model to export; wait for it "
            "to succeed (GET /jobs/{id})"
        )
    if body.kind == ExportKind.adapter and job.spec.get("lora") is None:
        raise Conflict(
            f"job {job_id} is a full fine-tune: it has no LoRA adapter to export; export it as "
            "kind: merged (its full model in the dtype you choose)"
        )
    run_dir = runs.run_dir(settings.runs_dir, job.id)
    step = resolve_step(session, job, settings, body.checkpoint)
    source = (
        run_dir / runs.FINAL
        if step is None
        else run_dir / runs.CHECKPOINTS / f"{runs.CHECKPOINT_PREFIX}{step}"
    )
    if not source.is_dir():
        raise Conflict(f"job {job_id} has no {source.name}/ folder in its run directory (it was removed)")
    if step is not None and not ((source / "adapter_config.json").is_file() or runs.has_weights(source)):
        raise Conflict(
            f"{source.name} of job {job_id} holds sharded states (FSDP or ZeRO), not weights an export "
            "loads; export final (or evaluate the checkpoint, which consolidates them)"
        )
    push = body.push_to_hub.model_dump() if body.push_to_hub is not None else None
    repo = ExportRepository(session, owner)
    shard = body.max_shard_size.upper().replace("IB", "iB")
    same = repo.find_same(
        job.id, kind=body.kind, dtype=body.dtype, max_shard_size=shard, push_to_hub=push, step=step
    )
    if same is not None:
        return same, True
    repo.hold_queue()
    side_runs.check_queue_cap(repo, repo.queued_count(), settings.max_queued_exports_per_owner)
    export = repo.add(
        job.id,
        kind=str(body.kind),
        dtype=str(body.dtype),
        max_shard_size=shard,
        push_to_hub=push,
        step=step,
    )
    session.commit()
    return export, False


def to_public(export: Export, queue: ExportQueue | None = None) -> ExportPublic:
    """The API's export; `queue`: the scheduler's row for it while it is queued."""
    return ExportPublic(
        **side_runs.public_fields(export, queue),
        kind=ExportKind(export.kind),
        dtype=ExportDtype(export.dtype),
        max_shard_size=export.max_shard_size,
        push_to_hub=PushToHub.model_validate(export.push_to_hub) if export.push_to_hub else None,
        path=str(Path(runs.EXPORTS) / export.id),
        checkpoint=ref_label(export.step),
    )


# Read and cancelled as every side run is.
RULES: side_runs.SideRuns[Export, ExportPublic] = side_runs.SideRuns(ExportRepository, to_public)
with_queue = RULES.with_queue
