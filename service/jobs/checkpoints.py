"""A job's checkpoints as the API lists them, and the checkpoint a new job resumes from (`resume_from`).
Which folders are checkpoints and which can be resumed is the run layout's rule (`ftq.contract.runs`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.schemas import Checkpoint
from ftq.contract.spec import JobSpec
from ftq.runtime.settings import Settings
from ftq.store import evaluations
from ftq.store.models import Job
from ftq.store.repository import JobRepository
from service.errors import spec_field_error


def list_checkpoints(job: Job, settings: Settings) -> list[Checkpoint]:
    run_dir = runs.run_dir(settings.runs_dir, job.id)
    return [
        Checkpoint(step=c.step, path=str(c.path), resumable=c.resumable)
        for c in runs.list_checkpoints(run_dir)
    ]


def scored_checkpoints(session: Session, job: Job, settings: Settings) -> list[Checkpoint]:
    """The checkpoints with what their evaluations scored and the best one marked (eval.select)."""
    rows = evaluations.of_job(session, job.id)
    metrics = evaluations.checkpoint_metrics(rows)
    best = evaluations.best_checkpoint(job.spec, rows)
    return [
        c.model_copy(
            update={"metrics": metrics.get(c.step, {}), "best": best is not None and best.step == c.step}
        )
        for c in list_checkpoints(job, settings)
    ]


def resume_checkpoint(spec: JobSpec, repo: JobRepository, settings: Settings) -> str | None:
    if spec.resume_from is None:
        return None
    source = repo.get(spec.resume_from.job_id)
    if source is None:
        raise spec_field_error(["resume_from", "job_id"], "no such job", "not_found")
    ckpts = [c for c in list_checkpoints(source, settings) if c.resumable]
    if not ckpts:
        raise spec_field_error(["resume_from", "job_id"], "that job has no resumable checkpoint", "not_found")
    want = spec.resume_from.checkpoint
    chosen = ckpts[-1] if want == "latest" else next((c for c in ckpts if c.step == want), None)
    if chosen is None:
        steps = ", ".join(str(c.step) for c in ckpts)
        raise spec_field_error(
            ["resume_from", "checkpoint"], f"no resumable checkpoint at step {want} (have {steps})"
        )
    check_resumable_here(spec, source, chosen)
    return chosen.path


def _kind(strategy: str) -> str:
    return strategy if strategy in ("fsdp", "deepspeed") else "plain"


def check_resumable_here(spec: JobSpec, source: Job, ckpt: Checkpoint) -> None:
    """Refuse at submit a checkpoint this job's strategy and world size cannot load, naming `resume_from`
    (rather than failing after the model has loaded). From the checkpoint folder's own files where they
    tell (runs.checkpoint_layout), else from the source job's spec:

    - one process or DDP (whole files): any strategy of that kind, any world size;
    - FSDP: the same FSDP version; another world size is accepted, since accelerate loads sharded
      (torch.distributed.checkpoint) and full state dicts through torch, which reshards at load;
    - DeepSpeed ZeRO: the same stage and the same world size only; DeepSpeed refuses partitions of
      another world size (a universal checkpoint could be loaded, but ftq's DeepSpeed config does not
      ask for one);
    - across strategies: never (each writes its own format)."""
    layout = runs.checkpoint_layout(Path(ckpt.path))
    src: dict[str, Any] = source.spec or {}
    src_dist = src.get("distributed") or {}
    src_res = src.get("resources") or {}
    src_world = int(src_res.get("num_nodes", 1)) * int(src_res.get("processes_per_node", 1))
    old_world = layout.world_size or src_world
    dist, world = spec.distributed, spec.resources.world_size
    new_kind = _kind(str(dist.strategy))
    where = f"checkpoint-{ckpt.step} of {source.id}"
    if layout.kind != new_kind:
        raise spec_field_error(
            ["resume_from"],
            f"{where} was written under {layout.kind} and this job runs {dist.strategy}: a checkpoint "
            f"resumes only under the strategy that wrote it; set distributed.strategy to match "
            f"({src_dist.get('strategy', 'none')}), or start a new run from its final/ model",
        )
    if new_kind == "fsdp":
        old_version = (src_dist.get("fsdp") or {}).get("version")
        if old_version is not None and int(old_version) != dist.fsdp.version:
            raise spec_field_error(
                ["resume_from"],
                f"{where} was written by FSDP{old_version} and this job runs FSDP{dist.fsdp.version}: "
                f"their sharded states differ; set distributed.fsdp.version: {old_version}",
            )
    if new_kind == "deepspeed":
        old_stage = (src_dist.get("deepspeed") or {}).get("zero_stage")
        if old_stage is not None and int(old_stage) != dist.deepspeed.zero_stage:
            raise spec_field_error(
                ["resume_from"],
                f"{where} was written under ZeRO-{old_stage} and this job runs ZeRO-"
                f"{dist.deepspeed.zero_stage}; set distributed.deepspeed.zero_stage: {old_stage}",
            )
        if old_world and old_world != world:
            universal = (
                " (it holds a universal checkpoint, which ftq does not load)" if layout.universal else ""
            )
            raise spec_field_error(
                ["resume_from"],
                f"{where} holds DeepSpeed ZeRO partitions for {old_world} processes and this job runs "
                f"{world}{universal}: DeepSpeed cannot load them on another world size; run on "
                f"{old_world} processes (resources.num_nodes x processes_per_node), or start a new run "
                "from its final/ model",
            )
    if old_world and old_world != world:
        _check_same_global_batch(spec, src, old_world, where)


def _check_same_global_batch(spec: JobSpec, src: dict[str, Any], old_world: int, where: str) -> None:
    """On another world size, the rows a step takes (micro-batch x accumulation x processes) must stay
    those of the run that wrote the checkpoint: the trainer finds its place in the data by skipping the
    steps already trained, in batches, so a step of another size would skip to the wrong row (and train
    again on rows it has seen, or never on others), and the schedule would count other steps."""
    src_training = src.get("training") or {}
    old_micro = int(src_training.get("per_device_train_batch_size", 1))
    old_accum = int(src_training.get("gradient_accumulation_steps", 1))
    old_rows = old_micro * old_accum * old_world
    training, world = spec.training, spec.resources.world_size
    rows = training.per_device_train_batch_size * training.gradient_accumulation_steps * world
    if rows == old_rows:
        return
    micro = training.per_device_train_batch_size
    fix = (
        f"set training.gradient_accumulation_steps: {old_rows // (micro * world)}"
        if old_rows % (micro * world) == 0
        else f"choose per_device_train_batch_size x gradient_accumulation_steps x {world} processes "
        f"= {old_rows}"
    )
    raise spec_field_error(
        ["resume_from"],
        f"{where} was trained on {old_rows} rows a step ({old_micro} x {old_accum} accumulation x "
        f"{old_world} processes) and this job takes {rows} ({micro} x {training.gradient_accumulation_steps} "
        f"x {world}): resuming would lose its place in the data; {fix}",
    )
