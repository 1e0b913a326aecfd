"""Fine-tuning jobs in OpenAI's shapes: a `/v1` create becomes an ordinary job spec (the catalog's
template, the files, the resolved hyperparameters) submitted through the native jobs service, and every
read projects a native job (plus its `openai_jobs` row) into a `fine_tuning.job`, its events, its
checkpoints and its result file. Nothing here is stored twice."""

from __future__ import annotations

import copy
import csv
import io
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.openai import (
    CheckpointMetrics,
    FineTuningJob,
    FineTuningJobCheckpoint,
    FineTuningJobEvent,
    JobCreate,
    JobErrorOut,
    OpenAIFile,
    SupervisedHyperparameters,
    WandbIntegration,
)
from ftq.contract.spec import JobSpec
from ftq.contract.status import TERMINAL, FileStatus, JobStatus
from ftq.planning import auto
from ftq.runtime.lru import LRU
from ftq.runtime.settings import Settings
from ftq.store import evaluations
from ftq.store.files_repository import FileRepository
from ftq.store.models import Job, JobEvent, MetricPoint, OpenAIJob, UploadedFile
from ftq.store.openai_repository import OpenAIRepository
from ftq.store.repository import JobRepository
from service.jobs import service as jobs_service
from service.openai import ids
from service.openai.errors import invalid, not_found
from service.openai.models import catalog, fine_tuned_name

# OpenAI's statuses for ftq's (a cancel in progress is the cancel the user asked for).
STATUS = {
    JobStatus.queued.value: "queued",
    JobStatus.starting.value: "queued",
    JobStatus.running.value: "running",
    "paused": "paused",
    JobStatus.cancelling.value: "cancelled",
    JobStatus.succeeded.value: "succeeded",
    JobStatus.failed.value: "failed",
    JobStatus.cancelled.value: "cancelled",
}


def _unix(value: Any) -> int | None:
    return int(value.timestamp()) if value is not None else None


# Create ---------------------------------------------------------------------------------------------------


def _method_of(body: JobCreate) -> tuple[str, dict[str, Any]]:
    """The method's type and its hyperparameters as written (`method`, else the legacy top level)."""
    if body.method is None:
        hyper = body.hyperparameters or SupervisedHyperparameters()
        return "supervised", hyper.model_dump()
    kind = body.method.type
    if kind not in ("supervised", "dpo", "reinforcement"):
        raise invalid(f"method.type must be supervised, dpo or reinforcement, not {kind!r}", "method.type")
    if body.hyperparameters is not None:
        raise invalid(
            "give the hyperparameters in method.<type>.hyperparameters, not also at the top level",
            "hyperparameters",
        )
    if kind == "reinforcement":
        if body.method.reinforcement is None:
            raise invalid(
                "method.type reinforcement needs method.reinforcement.grader (the reward it learns from)",
                "method.reinforcement.grader",
            )
        return kind, body.method.reinforcement.hyperparameters.model_dump()
    block = body.method.supervised if kind == "supervised" else body.method.dpo
    if block is None:
        return kind, {}
    return kind, block.hyperparameters.model_dump()


def _check_hyper(kind: str, hyper: dict[str, Any]) -> None:
    prefix = "hyperparameters" if kind == "legacy" else f"method.{kind}.hyperparameters"
    for name, low, high in (("n_epochs", 1, 50), ("batch_size", 1, 256)):
        value = hyper.get(name, "auto")
        if value != "auto" and not (low <= int(value) <= high):
            raise invalid(
                f"{name} must be 'auto' or an integer from {low} to {high}, not {value}", f"{prefix}.{name}"
            )
    lr = hyper.get("learning_rate_multiplier", "auto")
    if lr != "auto" and not (0 < float(lr) <= 100):
        raise invalid(
            f"learning_rate_multiplier must be 'auto' or a number above 0 and at most 100, not {lr}",
            f"{prefix}.learning_rate_multiplier",
        )
    beta = hyper.get("beta", "auto")
    if beta != "auto" and not (0 < float(beta) <= 2):
        raise invalid(f"beta must be 'auto' or a number above 0 and at most 2, not {beta}", f"{prefix}.beta")
    if kind == "reinforcement":
        _check_reinforcement(prefix, hyper)


def _check_reinforcement(prefix: str, hyper: dict[str, Any]) -> None:
    """What of OpenAI's reinforcement hyperparameters has a meaning here (docs/openai.md); the rest is a
    400 naming it rather than a setting silently ignored."""
    multiplier = hyper.get("compute_multiplier", "auto")
    if multiplier != "auto" and not (0 < float(multiplier) <= 16):
        raise invalid(
            f"compute_multiplier must be 'auto' or a number above 0 and at most 16, not {multiplier}",
            f"{prefix}.compute_multiplier",
        )
    interval = hyper.get("eval_interval", "auto")
    if interval != "auto" and not (1 <= int(interval) <= 1_000_000):
        raise invalid(
            f"eval_interval must be 'auto' or a number of steps from 1, not {interval}",
            f"{prefix}.eval_interval",
        )
    if hyper.get("eval_samples", "auto") != "auto":
        raise invalid(
            "eval_samples is not taken on this server: an evaluation samples num_generations completions of "
            "each validation prompt (set by compute_multiplier); leave it 'auto'",
            f"{prefix}.eval_samples",
            "unsupported_parameter",
        )
    if hyper.get("reasoning_effort", "default") != "default":
        raise invalid(
            "reasoning_effort is not taken on this server: the models it trains have no reasoning-effort "
            "setting; leave it 'default'",
            f"{prefix}.reasoning_effort",
            "unsupported_parameter",
        )


def _ready_files(
    session: Session, files: FileRepository, body: JobCreate, settings: Settings
) -> tuple[UploadedFile, UploadedFile | None]:
    """The training and validation files, waiting (up to FTQ_OPENAI_FILE_WAIT_SECONDS) for a file that
    is still being validated: OpenAI clients create the job right after the upload."""
    wanted = [("training_file", body.training_file)]
    if body.validation_file is not None:
        wanted.append(("validation_file", body.validation_file))
    deadline = time.monotonic() + settings.openai_file_wait_seconds
    found: dict[str, UploadedFile] = {}
    for param, v1_id in wanted:
        native = ids.file_in(v1_id)
        while True:
            row = files.get(native) if native else None
            if row is None:
                raise not_found(f"No such File object: {v1_id}", param)
            if row.status != FileStatus.validating or time.monotonic() >= deadline:
                break
            session.rollback()  # a new transaction, to see the validation commit (SQLite reads a snapshot)
            time.sleep(0.25)
        if row.status == FileStatus.validating:
            raise invalid(f"file {v1_id} is still being validated; retry shortly", param, "file_not_ready")
        if row.status != FileStatus.ready:
            first = (row.errors or [{"line": 0, "message": "invalid"}])[0]
            raise invalid(
                f"file {v1_id} has {row.error_count} invalid line(s); the first, line {first['line']}: "
                f"{first['message']}",
                param,
                "invalid_file",
            )
        found[param] = row
    return found["training_file"], found.get("validation_file")


# The spec keys a job made from a fine-tuned model keeps of the job that made it (the rest is the request's).
_KEPT = ("model", "lora", "distributed", "resources", "training")
# Training keys `resolve` sets from the request, dropped from the source job's training.
_PER_JOB = ("loss_on", "method", "dpo", "grpo", "grader", "seed", "eval_steps", "max_steps")


def fine_tuned_template(repo: OpenAIRepository, settings: Settings, model: str) -> dict[str, Any]:
    """The spec template of a job that goes on from `model`, an `ft:` name of one of this owner's
    succeeded jobs (as OpenAI allows): the source job's model, LoRA, strategy, resources and training,
    starting from its final/ (the adapter, trained further, for LoRA; the full weights otherwise) at the
    source's base learning rate. Another owner's name, or one that names no model, is a 404 on `model`."""
    job_hex = model.rsplit(":", 1)[-1]
    native = ids.job_in("ftjob-" + job_hex)
    found = repo.get(native) if native else None
    if found is None or fine_tuned_model(*found) != model:
        raise not_found(f"The model {model!r} does not exist or you do not have access to it", "model")
    source, extra = found
    final = runs.run_dir(settings.runs_dir, source.id) / runs.FINAL
    if not final.is_dir():
        raise invalid(
            f"the weights of {model} are no longer on this server (its final/ folder was removed)",
            "model",
            "model_not_available",
        )
    template = {k: copy.deepcopy(v) for k, v in source.spec.items() if k in _KEPT and v is not None}
    training = template.setdefault("training", {})
    for key in _PER_JOB:
        training.pop(key, None)
    if extra is not None:  # the request's multiplier scales the source's base rate, not its scaled one
        hyper = extra.method.get(extra.method["type"], {}).get("hyperparameters", {})
        multiplier = float(hyper.get("learning_rate_multiplier") or 1.0)
        training["learning_rate"] = float(training.get("learning_rate", 5.0e-5)) / multiplier
    model_part = template.setdefault("model", {})
    if template.get("lora") is not None:
        model_part["adapter"] = str(final)  # on the source's base model (and its adapter's own LoRA shape)
    else:
        model_part["name_or_path"] = str(final)
        model_part.pop("adapter", None)
        model_part.pop("revision", None)
    return template


def _template(body: JobCreate, settings: Settings, fine_tuned: dict[str, Any] | None) -> dict[str, Any]:
    """The spec the job starts from: an `ft:` model's (fine_tuned_template), else the catalog's."""
    if fine_tuned is not None:
        return fine_tuned
    if body.model.startswith("ft:"):
        raise invalid(f"model {body.model!r} names no fine-tuned model of yours", "model", "model_not_found")
    template = catalog(settings.openai_models).template_for(body.model)
    if template is None:
        raise invalid(
            f"model {body.model!r} is not available for fine-tuning: give an alias of GET /v1/models, a hub "
            "id (owner/name) or a local path (./path)",
            "model",
            "model_not_available",
        )
    return template


def _batches(kind: str, hyper: dict[str, Any], examples: int, world: int) -> tuple[int, int, int]:
    """(the batch an optimizer step takes across the ranks, the per-device batch, GRPO's generations per
    prompt or 0) for `batch_size` and, for reinforcement, `compute_multiplier` (ftq.planning.auto)."""
    batch, compute = hyper.get("batch_size", "auto"), hyper.get("compute_multiplier", "auto")
    b = auto.batches(
        examples,
        world,
        batch_size=None if batch == "auto" else int(batch),
        grpo=kind == "reinforcement",  # batch_size counts prompts, each completed in the same step
        compute_multiplier=None if compute == "auto" else float(compute),
    )
    return b.step_batch, b.per_device, b.generations


def _as_reinforcement(
    training: dict[str, Any],
    resolved: dict[str, Any],
    body: JobCreate,
    hyper: dict[str, Any],
    valid: UploadedFile | None,
    per_device: int,
    generations: int,
) -> None:
    """`training` made a GRPO run with the request's grader; its resolved hyperparameters into `resolved`."""
    assert body.method is not None and body.method.reinforcement is not None
    compute = hyper.get("compute_multiplier", "auto")
    resolved["compute_multiplier"] = 1.0 if compute == "auto" else float(compute)
    interval = hyper.get("eval_interval", "auto")
    if interval != "auto":
        if valid is None:
            raise invalid(
                "eval_interval needs a validation_file to evaluate on",
                "method.reinforcement.hyperparameters.eval_interval",
            )
        training["eval_steps"] = int(interval)
    resolved["eval_interval"] = training.get("eval_steps") or "auto"
    resolved["eval_samples"] = generations
    resolved["reasoning_effort"] = "default"
    if valid is not None:
        # GRPO's eval batch holds whole groups too.
        training["per_device_eval_batch_size"] = per_device
    training.pop("loss_on", None)
    # Completions up to half the template's sequence length (at most 256), unless the operator's
    # template says otherwise (training.grpo.max_completion_length).
    length = min(256, max(16, int(training.get("max_seq_len", 2048)) // 2))
    training.update(
        method="grpo",
        grpo={
            "max_completion_length": length,
            **(training.get("grpo") or {}),
            "num_generations": generations,
        },
        grader=body.method.reinforcement.grader.model_dump(mode="json", exclude_none=True),
    )


def resolve(
    body: JobCreate,
    settings: Settings,
    train: UploadedFile,
    valid: UploadedFile | None,
    fine_tuned: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the native spec, the method with every "auto" resolved) of a create request; `fine_tuned` is the
    template of an `ft:` model (fine_tuned_template)."""
    kind, hyper = _method_of(body)
    _check_hyper("legacy" if body.method is None else kind, hyper)
    template = _template(body, settings, fine_tuned)
    examples = train.rows or 0
    resources = template.setdefault("resources", {})
    world = int(resources.get("num_nodes", 1)) * int(resources.get("processes_per_node", 1))
    epochs = hyper.get("n_epochs", "auto")
    epochs = auto.auto_epochs(examples) if epochs == "auto" else int(epochs)
    batch, per_device, generations = _batches(kind, hyper, examples, world)
    multiplier = hyper.get("learning_rate_multiplier", "auto")
    multiplier = 1.0 if multiplier == "auto" else float(multiplier)
    training = template.setdefault("training", {})
    base_lr = float(training.get("learning_rate", 5.0e-5))
    steps_per_epoch = auto.steps_per_epoch(examples, batch)
    training.update(
        num_train_epochs=epochs,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=1,
        learning_rate=min(1.0, base_lr * multiplier),
        save_steps=steps_per_epoch,
        logging_steps=max(1, steps_per_epoch // 10),
        packing=False,
    )
    training.pop("max_steps", None)
    if body.seed is not None:
        training["seed"] = body.seed
    resolved: dict[str, Any] = {
        "n_epochs": epochs,
        "batch_size": batch,
        "learning_rate_multiplier": multiplier,
    }
    dataset: dict[str, Any] = {"file_id": train.id}
    if valid is not None:
        dataset["eval_file_id"] = valid.id
        training["eval_steps"] = steps_per_epoch
    if kind == "supervised" and "messages" in (train.formats or []):
        # As OpenAI does: a chat file trains on the assistant turns only (less those with `weight: 0`),
        # unless the operator's template chose otherwise.
        training.setdefault("loss_on", "assistant")
    if kind == "reinforcement":
        _as_reinforcement(training, resolved, body, hyper, valid, per_device, generations)
    if kind == "dpo":
        beta = hyper.get("beta", "auto")
        beta = auto.DEFAULT_BETA if beta == "auto" else float(beta)
        resolved["beta"] = beta
        # The format stays `auto`: the method picks the preference format the file's rows hold.
        training.update(method="dpo", dpo={"beta": beta})
    spec: dict[str, Any] = {
        "name": f"ft-{body.suffix}" if body.suffix else None,
        **template,
        "dataset": dataset,
    }
    if spec["name"] is None:
        spec.pop("name")
    if body.integrations:
        wandb = body.integrations[0].wandb
        spec["integrations"] = {
            "wandb": {"project": wandb.project, "entity": wandb.entity, "tags": list(wandb.tags or [])}
        }
    return spec, {"type": kind, kind: {"hyperparameters": resolved}}


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > 16:
        raise invalid("metadata holds at most 16 pairs", "metadata")
    for k, v in metadata.items():
        if len(k) > 64 or len(v) > 512:
            raise invalid("metadata keys are at most 64 characters and values at most 512", "metadata")


def request_digest(body: JobCreate) -> str:
    """What an Idempotency-Key of a `/v1` create is stored with: the request as sent (never the spec it
    resolves to, which reads the files' rows), apart from any digest of a native `POST /jobs`."""
    return jobs_service.request_hash({"/v1/fine_tuning/jobs": body.model_dump(mode="json")})


def replay(
    session: Session, owner: str, settings: Settings, idempotency_key: str, body: JobCreate
) -> FineTuningJob | None:
    """The job an earlier create with this Idempotency-Key made (`jobs_service.find_replay`: before the
    rate limit, the files' checks, the resolve and the cap), None for a new key."""
    job = jobs_service.find_replay(
        session, JobRepository(session, owner), idempotency_key, request_digest(body)
    )
    if job is None:
        return None
    found = OpenAIRepository(session, owner).get(job.id)
    assert found is not None
    return to_openai(found[0], found[1], settings)


def create(
    session: Session,
    owner: str,
    settings: Settings,
    body: JobCreate,
    idempotency_key: str | None,
) -> FineTuningJob:
    _check_metadata(body.metadata)
    if body.suffix is not None and not all(c.isalnum() or c in "-_" for c in body.suffix):
        raise invalid("suffix may hold letters, digits, - and _ only", "suffix")
    fine_tuned = None
    if body.model.startswith("ft:"):
        fine_tuned = fine_tuned_template(OpenAIRepository(session, owner), settings, body.model)
    train, valid = _ready_files(session, FileRepository(session, owner), body, settings)
    spec, method = resolve(body, settings, train, valid, fine_tuned)
    seed = int(spec["training"].get("seed", 42))

    def with_openai_row(job: Job) -> None:
        OpenAIRepository(session, owner).add(
            OpenAIJob(
                job_id=job.id,
                model=body.model,
                suffix=body.suffix,
                seed=seed,
                method=method,
                job_metadata=body.metadata,
                integrations=[i.model_dump() for i in body.integrations] if body.integrations else None,
            )
        )

    job, _ = jobs_service.create_job(
        session,
        JobRepository(session, owner),
        settings,
        spec,
        idempotency_key,
        with_openai_row,
        digest=request_digest(body),
    )
    found = OpenAIRepository(session, owner).get(job.id)
    assert found is not None
    return to_openai(found[0], found[1], settings)


# Reads ----------------------------------------------------------------------------------------------------


def get_or_404(repo: OpenAIRepository, v1_id: str, param: str | None = None) -> tuple[Job, OpenAIJob | None]:
    native = ids.job_in(v1_id)
    found = repo.get(native) if native else None
    if found is None:
        raise not_found(f"No such fine-tuning job: {v1_id}", param)
    return found


def fine_tuned_model(job: Job, extra: OpenAIJob | None) -> str | None:
    if job.status != JobStatus.succeeded:
        return None
    base = extra.model if extra is not None else str((job.spec.get("model") or {}).get("name_or_path"))
    return fine_tuned_name(base, job.owner, extra.suffix if extra else None, ids.job_hex(job.id))


def to_openai(job: Job, extra: OpenAIJob | None, settings: Settings) -> FineTuningJob:
    spec = job.spec
    training = spec.get("training") or {}
    dataset = spec.get("dataset") or {}
    if extra is not None:
        method = extra.method
        hyper = method.get(method["type"], {}).get("hyperparameters", {})
        model = extra.model
    else:
        world = JobSpec.model_validate(spec).resources.world_size
        hyper = {
            "n_epochs": training.get("num_train_epochs"),
            "batch_size": training.get("per_device_train_batch_size", 1)
            * training.get("gradient_accumulation_steps", 1)
            * world,
            "learning_rate_multiplier": 1.0,
        }
        kinds = {"dpo": "dpo", "grpo": "reinforcement"}
        kind = kinds.get(str(training.get("method")), "supervised")
        method = {"type": kind, kind: {"hyperparameters": hyper}}
        model = str((spec.get("model") or {}).get("name_or_path"))
    if method.get("type") == "reinforcement":
        # OpenAI's reinforcement method carries its grader: the spec's, as the trainer scores with it.
        block = method.get("reinforcement") or {}
        method = {"type": "reinforcement", "reinforcement": {**block, "grader": training.get("grader")}}
    status = STATUS.get(str(job.status), str(job.status))
    error = None
    if job.status == JobStatus.failed:
        error = JobErrorOut(code=job.error_code or "unknown", message=job.error_message or "the job failed")
    # A listed job's plan is not read (OpenAIRepository.page); a retrieved one's is.
    plan = job.__dict__.get("plan") or {}
    estimated = plan.get("time_estimate") or {}
    estimated_finish = None
    if job.estimated_seconds and job.status in (JobStatus.queued, JobStatus.starting, JobStatus.running):
        start = job.started_at or job.created_at
        estimated_finish = int(start.timestamp() + job.estimated_seconds)
    train_file = dataset.get("file_id")
    valid_file = dataset.get("eval_file_id")
    tokens = estimated.get("tokens") if isinstance(estimated, dict) else None
    return FineTuningJob(
        id=ids.job_out(job.id),
        created_at=int(job.created_at.timestamp()),
        error=error,
        fine_tuned_model=fine_tuned_model(job, extra),
        finished_at=_unix(job.finished_at),
        hyperparameters=dict(hyper),
        model=model,
        organization_id=job.owner,
        result_files=[ids.result_file_out(job.id)] if job.status == JobStatus.succeeded else [],
        seed=extra.seed if extra is not None else int(training.get("seed", 42)),
        status=status,
        trained_tokens=int(tokens) if tokens and job.status == JobStatus.succeeded else None,
        training_file=ids.file_out(train_file) if train_file else dataset.get("name_or_path"),
        validation_file=ids.file_out(valid_file) if valid_file else None,
        estimated_finish=estimated_finish,
        integrations=[WandbIntegration(wandb=i["wandb"]) for i in extra.integrations]
        if extra is not None and extra.integrations
        else None,
        metadata=extra.job_metadata if extra is not None else None,
        method=method,
    )


# Events ---------------------------------------------------------------------------------------------------

_MESSAGES: dict[str, Callable[[dict[str, Any]], str]] = {
    "job.created": lambda d: "Created fine-tuning job",
    "job.queued": lambda d: "Job queued" + (f" (position {d['position']})" if d.get("position") else ""),
    "job.started": lambda d: "Fine-tuning job started",
    "job.checkpoint": lambda d: f"Checkpoint created at step {d.get('step')}",
    "job.eval": lambda d: f"Evaluation at step {d.get('step')}",
    "job.sample": lambda d: f"Sample at step {d.get('step')}",
    "job.evaluation": lambda d: f"Checkpoint {d.get('checkpoint')} evaluated: {d.get('status')}",
    "job.warning": lambda d: str(d.get("message") or d.get("kind") or "warning"),
    "job.retried": lambda d: f"Job retried (attempt {d.get('attempt')}): {d.get('reason', '')}".rstrip(": "),
    "job.succeeded": lambda d: "The job has successfully completed",
    "job.failed": lambda d: "The job failed: " + str((d.get("error") or {}).get("message", "")),
    "job.cancelled": lambda d: "The job was cancelled",
    "job.paused": lambda d: "Fine-tuning job paused",
    "job.resumed": lambda d: "Fine-tuning job resumed",
}
_LEVELS = {"job.warning": "warn", "job.failed": "error"}


def _message_event(e: JobEvent) -> tuple[float, FineTuningJobEvent]:
    data = e.data or {}
    message = _MESSAGES.get(e.type, lambda d: e.type)(data)
    event = FineTuningJobEvent(
        id=f"ftevent-e{e.id}",
        created_at=int(e.time.timestamp()),
        level=_LEVELS.get(e.type, "info"),  # type: ignore[arg-type]
        message=message,
        type="message",
        data={"ftq_type": e.type, **data},
    )
    return e.time.timestamp(), event


def _metrics_event(
    p: MetricPoint, max_steps: int | None, fallback: float
) -> tuple[float, FineTuningJobEvent]:
    extra = p.extra or {}
    data = {
        "step": p.step,
        "total_steps": max_steps,
        "epoch": p.epoch,
        "train_loss": p.loss,
        "valid_loss": p.eval_loss,
        "train_mean_token_accuracy": extra.get("mean_token_accuracy"),
        "valid_mean_token_accuracy": extra.get("eval_mean_token_accuracy"),
        "learning_rate": p.learning_rate,
        # Reinforcement (GRPO) jobs: the grader's reward over the step's completions, and each grader's.
        "train_reward_mean": extra.get("reward"),
        "train_reward_std": extra.get("reward_std"),
        "valid_reward_mean": extra.get("eval_reward"),
        "train_mean_completion_length": extra.get("completions/mean_length"),
        **{
            f"train_reward_{key.removeprefix('rewards/').removesuffix('/mean')}_mean": value
            for key, value in extra.items()
            if key.startswith("rewards/") and key.endswith("/mean")
        },
    }
    parts = []
    if p.loss is not None:
        parts.append(f"training loss={p.loss:.4f}")
    if p.eval_loss is not None:
        parts.append(f"validation loss={p.eval_loss:.4f}")
    if extra.get("reward") is not None:
        parts.append(f"reward={extra['reward']:.4f}")
    at = p.time if p.time is not None else fallback
    event = FineTuningJobEvent(
        id=f"ftevent-m{p.step}",
        created_at=int(at),
        level="info",
        message=f"Step {p.step}/{max_steps or '?'}: " + ", ".join(parts),
        type="metrics",
        data={k: v for k, v in data.items() if v is not None},
    )
    return at, event


class _EventsCache:
    """Each job's merged events, built once for a job that has ended (nothing is added to it after its
    status: ingest writes the last metrics first) and for half a second for one that has not, so that
    polling `list_events` costs a page of a list, not a read and merge of every point."""

    def __init__(self, size: int = 256, fresh_seconds: float = 0.5):
        self._fresh = fresh_seconds
        # Keyed by whether the job had ended when built: a list built while it ran is not its final one.
        self._lists: LRU[tuple[str, bool], list[FineTuningJobEvent]] = LRU(size)

    def get(self, repo: OpenAIRepository, job: Job) -> list[FineTuningJobEvent]:
        ended = job.status in TERMINAL
        held = self._lists.get((job.id, ended))
        if held is not None:
            return held
        built = _merged_events(repo, job)
        self._lists.put((job.id, ended), built, ttl=None if ended else self._fresh)
        return built


_events_cache = _EventsCache()


def events(repo: OpenAIRepository, job: Job) -> list[FineTuningJobEvent]:
    """The job's events and its metrics, newest first (OpenAI's order)."""
    return _events_cache.get(repo, job)


def _merged_events(repo: OpenAIRepository, job: Job) -> list[FineTuningJobEvent]:
    fallback = (job.started_at or job.created_at).timestamp()
    merged = [_message_event(e) for e in repo.events(job.id)]
    merged += [_metrics_event(p, job.progress_max_steps, fallback) for p in repo.points(job.id)]
    # By time; at the same second a step's metrics before the event it caused (a checkpoint at that step).
    merged.sort(key=lambda pair: (pair[0], pair[1].type != "metrics"))
    return [event for _, event in reversed(merged)]


# Checkpoints and the result file --------------------------------------------------------------------------


def _at_or_before(
    points: list[MetricPoint], step: int, read: Callable[[MetricPoint], float | None]
) -> float | None:
    value = None
    for p in points:
        if p.step > step:
            break
        got = read(p)
        if got is not None:
            value = got
    return value


def checkpoints(
    repo: OpenAIRepository, job: Job, extra: OpenAIJob | None, settings: Settings
) -> list[FineTuningJobCheckpoint]:
    """The job's checkpoints, newest first, with OpenAI's metric names."""
    points = repo.points(job.id)
    run_dir = runs.run_dir(settings.runs_dir, job.id)
    base = fine_tuned_name(
        extra.model if extra is not None else str((job.spec.get("model") or {}).get("name_or_path")),
        job.owner,
        extra.suffix if extra is not None else None,
        ids.job_hex(job.id),
    )
    scores = evaluations.checkpoint_metrics(evaluations.of_job(repo.session, job.id))
    loss_names = [
        f"{s['name']}/loss"
        for s in ((job.spec or {}).get("eval") or {}).get("suites") or []
        if s.get("type") == "loss"
    ]
    out = []
    for ckpt in runs.list_checkpoints(run_dir):
        step = ckpt.step
        at = next((p for p in points if p.step == step), None)
        # A `loss` evaluation suite scored this checkpoint on a whole dataset: that is its full_valid_loss.
        scored = scores.get(step, {})
        full_loss = next((scored[n] for n in loss_names if n in scored), None)
        valid_loss = _at_or_before(points, step, lambda p: p.eval_loss)
        valid_acc = _at_or_before(points, step, lambda p: (p.extra or {}).get("eval_mean_token_accuracy"))
        metrics = CheckpointMetrics(
            step=float(step),
            train_loss=_at_or_before(points, step, lambda p: p.loss),
            train_mean_token_accuracy=_at_or_before(
                points, step, lambda p: (p.extra or {}).get("mean_token_accuracy")
            ),
            valid_loss=valid_loss,
            valid_mean_token_accuracy=valid_acc,
            full_valid_loss=full_loss
            if full_loss is not None
            else (at.eval_loss if at is not None else None),
            full_valid_mean_token_accuracy=(at.extra or {}).get("eval_mean_token_accuracy") if at else None,
        )
        try:
            created = int(ckpt.path.stat().st_mtime)
        except OSError:
            created = int((job.finished_at or job.created_at).timestamp())
        out.append(
            FineTuningJobCheckpoint(
                id=ids.checkpoint_out(job.id, step),
                created_at=created,
                fine_tuned_model_checkpoint=f"{base}:ckpt-step-{step}",
                fine_tuning_job_id=ids.job_out(job.id),
                metrics=metrics,
                step_number=step,
            )
        )
    return list(reversed(out))


RESULT_COLUMNS = ("step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy")


def result_csv(points: list[MetricPoint]) -> bytes:
    """OpenAI's result file: one row per logged step."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(RESULT_COLUMNS)
    for p in points:
        extra = p.extra or {}
        row = [
            p.step,
            p.loss,
            extra.get("mean_token_accuracy"),
            p.eval_loss,
            extra.get("eval_mean_token_accuracy"),
        ]
        writer.writerow(["" if v is None else v for v in row])
    return out.getvalue().encode()


def result_file(repo: OpenAIRepository, v1_id: str) -> tuple[OpenAIFile, bytes]:
    native = ids.result_file_job(v1_id)
    found = repo.get(native) if native else None
    if found is None or found[0].status != JobStatus.succeeded:
        raise not_found(f"No such File object: {v1_id}", "file_id")
    job = found[0]
    content = result_csv(repo.points(job.id))
    return (
        OpenAIFile(
            id=v1_id,
            bytes=len(content),
            created_at=int((job.finished_at or job.created_at).timestamp()),
            filename="step_metrics.csv",
            purpose="fine-tune-results",
            status="processed",
        ),
        content,
    )


# The native lifecycle calls a /v1 job takes: a pause (a checkpoint, the ranks ended, the devices freed),
# a resume (queued again, to continue from the pause's checkpoint) and a cancel.
CHANGES = {
    "pause": jobs_service.pause_job,
    "resume": jobs_service.resume_job,
    "cancel": jobs_service.cancel,
}


def change(session: Session, owner: str, v1_id: str, settings: Settings, what: str) -> FineTuningJob:
    """The native `what` (one of CHANGES) on this owner's /v1 job, seen as OpenAI's job."""
    job, extra = get_or_404(OpenAIRepository(session, owner), v1_id)
    CHANGES[what](session, JobRepository(session, owner), job.id)
    session.refresh(job)
    return to_openai(job, extra, settings)
