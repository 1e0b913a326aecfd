"""The OpenAI-compatible API's objects (`/v1`), in the shapes the `openai` Python SDK sends and parses:
ids with OpenAI's prefixes, Unix-second timestamps, lists as `{"object": "list", "data", "has_more"}`,
errors as `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from ftq.contract.graders import Grader

T = TypeVar("T")

# OpenAI's metadata: at most 16 pairs, keys up to 64 characters, values up to 512.
MAX_METADATA_PAIRS = 16


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorBody(BaseModel):
    error: OpenAIErrorDetail


class OpenAIList(BaseModel, Generic[T]):
    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None


class OpenAIFile(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"]
    status_details: str | None = None
    expires_at: int | None = None


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class UploadCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    bytes: int = Field(ge=0)
    filename: str = Field(min_length=1, max_length=1024)
    mime_type: str = Field(max_length=255)
    purpose: str = Field(max_length=64)
    expires_after: dict[str, Any] | None = None


class UploadComplete(BaseModel):
    model_config = ConfigDict(extra="forbid")

    part_ids: list[str] = Field(max_length=10_000)
    md5: str | None = Field(None, max_length=64)


class Upload(BaseModel):
    id: str
    object: Literal["upload"] = "upload"
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: Literal["pending", "completed", "cancelled", "expired"]
    file: OpenAIFile | None = None


class UploadPart(BaseModel):
    id: str
    object: Literal["upload.part"] = "upload.part"
    created_at: int
    upload_id: str


# Fine-tuning jobs ------------------------------------------------------------------------------------------

Auto = Literal["auto"]


class SupervisedHyperparameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_epochs: Auto | int = Field("auto", description="Passes over the training file; `auto`: from its size.")
    batch_size: Auto | int = Field("auto", description="Examples per optimizer step; `auto`: from its size.")
    learning_rate_multiplier: Auto | float = Field(
        "auto", description="Scales the model template's base learning rate; `auto`: 1."
    )


class DpoHyperparameters(SupervisedHyperparameters):
    beta: Auto | float = Field("auto", description="DPO's beta; `auto`: 0.1.")


class SupervisedMethod(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hyperparameters: SupervisedHyperparameters = Field(default_factory=SupervisedHyperparameters)


class DpoMethod(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hyperparameters: DpoHyperparameters = Field(default_factory=DpoHyperparameters)


class ReinforcementHyperparameters(SupervisedHyperparameters):
    """OpenAI's reinforcement hyperparameters, as ftq's GRPO reads them (docs/openai.md)."""

    compute_multiplier: Auto | float = Field(
        "auto",
        description="Scales the completions sampled per prompt (training.grpo.num_generations, 8 at 1.0; "
        "at least 2); `auto`: 1.",
    )
    eval_interval: Auto | int = Field(
        "auto",
        description="Steps between evaluations on the validation_file (training.eval_steps); `auto`: once "
        "per epoch. Needs a validation_file.",
    )
    eval_samples: Auto | int = Field(
        "auto", description="Not taken: an evaluation samples num_generations completions per prompt."
    )
    reasoning_effort: Literal["default", "low", "medium", "high"] = Field(
        "default", description="Only `default`: the models trained here have no reasoning-effort setting."
    )


class ReinforcementMethod(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grader: Grader = Field(description="The reward: one grader or a multi grader, as for /graders/run.")
    hyperparameters: ReinforcementHyperparameters = Field(default_factory=ReinforcementHyperparameters)


class MethodIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str = Field(description="supervised, dpo or reinforcement (GRPO with the method's grader).")
    supervised: SupervisedMethod | None = None
    dpo: DpoMethod | None = None
    reinforcement: ReinforcementMethod | None = None


class WandbIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str
    entity: str | None = None
    name: str | None = None
    tags: list[str] | None = None


class IntegrationIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["wandb"]
    wandb: WandbIn


class JobCreate(BaseModel):
    """`POST /v1/fine_tuning/jobs` as the SDK's `client.fine_tuning.jobs.create(...)` sends it."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=256)
    training_file: str = Field(min_length=1, max_length=64)
    validation_file: str | None = Field(None, max_length=64)
    hyperparameters: SupervisedHyperparameters | None = Field(
        None, description="Legacy: the supervised method's hyperparameters."
    )
    method: MethodIn | None = None
    suffix: str | None = Field(None, min_length=1, max_length=64)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    metadata: dict[str, str] | None = None
    integrations: list[IntegrationIn] | None = Field(None, max_length=8)


class JobErrorOut(BaseModel):
    code: str
    message: str
    param: str | None = None


class WandbIntegration(BaseModel):
    type: Literal["wandb"] = "wandb"
    wandb: dict[str, Any]


class FineTuningJob(BaseModel):
    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    created_at: int
    error: JobErrorOut | None = None
    fine_tuned_model: str | None = None
    finished_at: int | None = None
    hyperparameters: dict[str, Any]
    model: str
    organization_id: str
    result_files: list[str]
    seed: int
    status: str
    trained_tokens: int | None = None
    training_file: str | None
    validation_file: str | None = None
    estimated_finish: int | None = None
    integrations: list[WandbIntegration] | None = None
    metadata: dict[str, str] | None = None
    method: dict[str, Any] | None = None


class FineTuningJobEvent(BaseModel):
    id: str
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    created_at: int
    level: Literal["info", "warn", "error"]
    message: str
    type: Literal["message", "metrics"]
    data: dict[str, Any] | None = None


class CheckpointMetrics(BaseModel):
    step: float | None = None
    train_loss: float | None = None
    train_mean_token_accuracy: float | None = None
    valid_loss: float | None = None
    valid_mean_token_accuracy: float | None = None
    full_valid_loss: float | None = None
    full_valid_mean_token_accuracy: float | None = None


class FineTuningJobCheckpoint(BaseModel):
    id: str
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    created_at: int
    fine_tuned_model_checkpoint: str
    fine_tuning_job_id: str
    metrics: CheckpointMetrics
    step_number: int


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
