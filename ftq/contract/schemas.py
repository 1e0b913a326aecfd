"""The API's response models (the contract's Job, Point, pages, plan): the service serves them and the
client SDK (`ftq.client`) parses them, so both sides share one definition."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ftq.contract.errors import ErrorCode
from ftq.contract.evaluation import CheckpointRef
from ftq.contract.metrics import Point
from ftq.contract.plans import Plan
from ftq.contract.spec import HUB_ID_RE, JobSpec
from ftq.contract.status import FileStatus, JobStatus

# The plan is rendered by the core's pure renderer; the API serves that same model.
PlanPublic = Plan

__all__ = ["ErrorCode", "JobStatus", "PlanPublic", "Point"]


class Progress(BaseModel):
    step: int | None = None
    max_steps: int | None = None
    epoch: float | None = None
    eta_seconds: float | None = None
    phase: str | None = Field(
        None,
        description="What the job is doing: queued, starting (processes starting), fetching (the fetch "
        "step downloading hub models and datasets before the processes start; the message gives the bytes "
        "done), "
        "loading (tokenizer, "
        "data, model, trainer), training, saving (the final model), cancelling, pausing (a pause is saving a "
        "checkpoint and stopping the run), paused; null once it ended.",
    )
    message: str | None = Field(
        None,
        description="The phase in words, while there is no step to show: `starting 2 processes`, `loading "
        "the tokenizer, dataset and model`, `saving the final model`; null while training.",
    )


class JobError(BaseModel):
    code: ErrorCode
    message: str
    exit_code: int | None = None


class TrackerRun(BaseModel):
    name: str | None = Field(None, description="The tracker's name for the run (the job id).")
    id: str | None = Field(None, description="The tracker's id of the run (W&B run id, MLflow run_id).")
    url: str | None = Field(
        None, description="Where to see the run; null where there is none (W&B offline, TensorBoard)."
    )
    project: str | None = Field(None, description="W&B: the project.")
    experiment: str | None = Field(None, description="MLflow: the experiment.")
    mode: str | None = Field(None, description="W&B: online, offline or disabled (the operator's setting).")
    dir: str | None = Field(
        None, description="Files the tracker wrote in the run directory (W&B's run folder, TensorBoard's)."
    )


class QueueInfo(BaseModel):
    position: int | None = Field(
        None, description="1 = starts next among this server's waiting local jobs; null on SLURM."
    )
    reason: str = Field(
        description="Why it waits: no_free_devices (not enough free GPUs or CPU slots), reservation (it "
        "would fit, but could delay the start reserved for a larger job ranked ahead; jobs whose "
        "resources.max_seconds ends before that start may go ahead), quota (its owner holds their "
        "concurrent quota); on SLURM, SLURM's pending reason (Priority, Resources, ...)."
    )
    estimated_start: datetime | None = Field(
        None,
        description="When it should start, from the running jobs' time limits or time estimates; null "
        "when it cannot be told (quota).",
    )


class Usage(BaseModel):
    devices: int = Field(description="GPUs (cuda) or CPU processes the run held.")
    device_seconds: float = Field(description="devices x the run's wall time (launch to end; SLURM's own).")
    gpu_hours: float = Field(description="device_seconds / 3600 for a cuda job; 0 for a cpu job.")


class EstimateVsActual(BaseModel):
    estimated_seconds: float | None = Field(description="The plan's time_estimate.seconds.")
    actual_seconds: float = Field(description="The run's wall time, launch to end.")
    ratio: float | None = Field(description="actual / estimated (> 1: the run took longer than estimated).")


class BestCheckpoint(BaseModel):
    step: int
    metric: str
    value: float


class JobPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    owner: str
    status: JobStatus
    spec: JobSpec
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    launcher: str
    external_id: str | None
    progress: Progress
    latest_metrics: Point | None
    error: JobError | None = Field(
        description="Why a failed job failed; null while it runs, once it succeeded, and for a cancelled "
        "job (a cancel is what its owner asked for, not an error)."
    )
    trackers: dict[str, TrackerRun] | None = Field(
        None,
        description="The runs the spec's `integrations` made, by tracker (`wandb`, `mlflow`, `tensorboard`), "
        "once training has started; null for a job without trackers or before its trainer started them.",
    )
    queue: QueueInfo | None = Field(
        None, description="While the job waits (queued here, or pending in SLURM): where and why; else null."
    )
    usage: Usage | None = Field(None, description="What the run used, once it ended; null before.")
    estimate_vs_actual: EstimateVsActual | None = Field(
        None, description="The plan's time estimate beside the run's wall time, once it succeeded."
    )
    best_checkpoint: BestCheckpoint | None = Field(
        None,
        description="The checkpoint that scores best by the spec's `eval.select`, from its evaluations; "
        "null without eval.select or before one was scored.",
    )


class UsageRow(BaseModel):
    owner: str
    day: str | None = Field(description="UTC day (YYYY-MM-DD) the runs ended; null with group_by=owner.")
    device_seconds: float = Field(
        description="Sum of the runs' devices x wall time: jobs', exports' and evaluations' (one device "
        "each), and serving engines'."
    )
    gpu_hours: float = Field(description="The cuda runs' device_seconds / 3600.")
    jobs: int = Field(description="Jobs that ended in the range (jobs that never started are not counted).")
    exports: int = Field(
        0, description="Exports that ran and ended in the range (counted in device_seconds)."
    )
    evaluations: int = Field(
        0, description="Evaluations that ran and ended in the range (counted in device_seconds)."
    )
    deployments: int = Field(
        0,
        description="Serving engines that ran and ended (stopped) in the range: their devices x the time "
        "they held them are in device_seconds.",
    )
    training_clients: int = Field(
        0,
        description="Tinker training clients that ran and ended in the range: their devices x the time "
        "they held them are in device_seconds.",
    )
    prompt_tokens: int = Field(0, description="Tokens in: the prompts those engines answered.")
    completion_tokens: int = Field(0, description="Tokens out: what those engines generated.")


class UsagePage(BaseModel):
    data: list[UsageRow]


class JobList(BaseModel):
    data: list[JobPublic]
    next_cursor: str | None


class LogChunk(BaseModel):
    offset: int
    next_offset: int
    text: str
    complete: bool


class MetricsPage(BaseModel):
    data: list[Point]
    next_after_step: int
    complete: bool


class SamplePublic(BaseModel):
    step: int = Field(description="The training step the model had reached when it generated this.")
    index: int = Field(description="The prompt's position in the spec's eval.sample_prompts.")
    prompt: str
    completion: str = Field(
        description="The greedy completion (new text only), cut at EOS; for a GRPO rollout, a sampled one."
    )
    time: float | None = Field(None, description="When it was written (Unix seconds, the trainer's clock).")
    reward: float | None = Field(
        None,
        description="A GRPO rollout's reward (training.grader's score of the completion); null for the "
        "completions of eval.sample_prompts. Rollouts have index 8 and up.",
    )


class SamplesPage(BaseModel):
    data: list[SamplePublic] = Field(
        description="Samples of whole steps after after_step (every prompt of a step on the same page), "
        "by step, then prompt index."
    )
    next_after_step: int = Field(description="The after_step of the next page (the last step here).")
    complete: bool = Field(
        description="True once the job has ended and this page holds the last of its samples."
    )


class Checkpoint(BaseModel):
    step: int
    path: str
    resumable: bool
    metrics: dict[str, float] = Field(
        default_factory=dict,
        description="What the evaluations of this checkpoint scored (`<suite>/score`, "
        "`<suite>/<task>/<metric>`, `<suite>/loss`); empty until one succeeded.",
    )
    best: bool = Field(False, description="The job's best checkpoint by its spec's `eval.select`.")


SuiteNameRef = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$")]


class EvaluationCreate(BaseModel):
    """`POST /jobs/{id}/evaluations`: evaluate a saved checkpoint (or final/) with the spec's suites."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: CheckpointRef = Field(
        "final", description="`final` (the succeeded job's final/), `best` (by eval.select), or a step."
    )
    suites: list[SuiteNameRef] | None = Field(
        None, max_length=8, description="The spec's suites to run, by name; null: all of them."
    )


class EvaluationPublic(BaseModel):
    id: str = Field(description="Evaluation id, e.g. eval_0123456789abcdef")
    job_id: str
    checkpoint: str = Field(description="`final`, or the step of the checkpoint evaluated.")
    status: JobStatus
    results: dict[str, float] | None = Field(
        description="The metrics, once it succeeded (`<suite>/score`, `<suite>/<task>/<metric>`, ...)."
    )
    error: JobError | None
    suites: list[str] | None = Field(None, description="The suites asked for; null: all of the spec's.")
    trigger: str = Field(description="checkpoint | final (the spec's eval.on) or request (POST).")
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    queue: QueueInfo | None = None


class EvaluationList(BaseModel):
    data: list[EvaluationPublic]


class CheckpointList(BaseModel):
    data: list[Checkpoint]


class ErrorBody(BaseModel):
    detail: str
    code: str


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)


# Exports --------------------------------------------------------------------------------------------------


class ExportKind(StrEnum):
    merged = "merged"
    adapter = "adapter"


class ExportDtype(StrEnum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


class PushToHub(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repo_id: str = Field(
        pattern=HUB_ID_RE,
        description="The Hugging Face Hub repo to push the export to (`owner/name`); created when missing. "
        "The push uses the operator's token (FTQ_HUB_TOKEN), never one from the request.",
    )
    private: bool = Field(True, description="Create the repo private (when it does not exist yet).")


class ExportCreate(BaseModel):
    """`POST /jobs/{id}/exports`: what to export of a succeeded job's `final/`."""

    model_config = ConfigDict(extra="forbid")

    kind: ExportKind = Field(
        description="`merged`: the LoRA adapter folded into the base model's weights (a full fine-tune: its "
        "model re-saved), a folder `AutoModelForCausalLM.from_pretrained` loads. `adapter`: the LoRA "
        "adapter alone, converted to `dtype` (a full fine-tune has none: 409)."
    )
    dtype: ExportDtype = Field(ExportDtype.bf16, description="The dtype the weights are saved in.")
    max_shard_size: str = Field(
        "5GB",
        pattern=r"^[0-9]{1,6}(\.[0-9]{1,3})?(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$",
        description="The largest safetensors shard, as transformers writes it (`500MB`, `2GB`, `5GB`).",
    )
    push_to_hub: PushToHub | None = Field(
        None, description="Also push the export to this Hub repo once written (needs FTQ_HUB_TOKEN set)."
    )
    checkpoint: CheckpointRef = Field(
        "final",
        description="What to export: `final` (final/), `best` (the best checkpoint by the spec's "
        "eval.select), or a saved checkpoint's step (one holding an adapter or whole weights).",
    )


class ExportPublic(BaseModel):
    """One export of a job. A second identical request (same kind, dtype, max_shard_size and push) while
    one is queued, starting, running or succeeded returns that one (200) instead of a new one (202)."""

    id: str = Field(description="Export id, e.g. exp_0123456789abcdef")
    job_id: str
    kind: ExportKind
    dtype: ExportDtype
    max_shard_size: str
    push_to_hub: PushToHub | None
    status: JobStatus = Field(
        description="As a job's: queued, starting, running, cancelling, then succeeded, failed or cancelled."
    )
    error: JobError | None = Field(
        description="Why a failed export failed (code and message, as a job's); null otherwise."
    )
    path: str = Field(
        description="Where the export is, relative to the job's run directory: `exports/<export id>`, "
        "holding the safetensors shards (or the adapter), the tokenizer, generation_config.json and "
        "README.md (the model card). Download it as `GET /jobs/{id}/artifacts/exports/<export id>.tar`."
    )
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    queue: QueueInfo | None = Field(
        None,
        description="While the export is queued: its place in the one queue it shares with jobs (the same "
        "quotas, fair share and reservation), why it waits and when it should start; null otherwise.",
    )
    checkpoint: str = Field("final", description="What was exported: `final`, or a checkpoint's step.")


class ExportList(BaseModel):
    data: list[ExportPublic] = Field(description="The job's exports, newest first.")


# Events and webhooks -----------------------------------------------------------------------------------


class Event(BaseModel):
    id: int = Field(description="Increasing across the server: the cursor of `?after=`.")
    job_id: str
    type: str = Field(
        description="job.created, job.queued, job.started, job.checkpoint, job.eval, job.sample, "
        "job.evaluation, job.warning, job.retried, job.paused, job.resumed, job.succeeded, job.failed or "
        "job.cancelled."
    )
    time: datetime
    data: dict[str, Any] = Field(
        description="By type: queued `{position}`; started `{launcher, host, external_id, slurm_job_id, pid, "
        "num_nodes, processes_per_node, attempt}`; checkpoint `{step, path}`; eval `{step, metrics}`; "
        "sample `{step, prompt, completion}`; warning `{kind: nan_loss|loss_exploding|loss_spike|straggler, "
        "step, message}`; retried `{attempt, reason}`; paused `{step, checkpoint}` (the last step trained, "
        "the checkpoint's step a resume continues from or null); resumed `{checkpoint}`; failed and "
        "cancelled `{error: {code, message, exit_code}}`."
    )


class EventPage(BaseModel):
    data: list[Event]
    next_after: int = Field(description="Pass as `after` to get the events after this page (the last id).")


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        max_length=2048,
        description="http(s) URL that receives a POST per event. Checked when created and before each send: "
        "outside FTQ_ENV=development, private, loopback and link-local addresses are refused unless "
        "the operator allows them (FTQ_WEBHOOK_ALLOWED_NETWORKS).",
    )
    events: list[str] = Field(
        min_length=1, max_length=32, description="Event types to deliver, e.g. [job.succeeded, job.failed]."
    )


class WebhookPublic(BaseModel):
    id: str
    url: str
    events: list[str]
    secret: str | None = Field(
        None,
        description="`whsec_<base64>`: the signing key, shown only when the webhook is created and when its "
        "secret is rotated. Verify `webhook-signature` (v1, base64 HMAC-SHA256 of "
        "`<webhook-id>.<webhook-timestamp>.<body>` keyed with the base64-decoded part after whsec_).",
    )
    enabled: bool
    disabled_reason: str | None = Field(None, description="Why the server disabled it (failures in a row).")
    created_at: datetime


class WebhookPayload(BaseModel):
    """The body of each webhook delivery (a POST to the webhook's URL)."""

    type: str = Field(description="The event's type, e.g. job.succeeded.")
    timestamp: datetime = Field(description="When the event happened (UTC).")
    data: dict[str, Any] = Field(
        description="`event_id`, `job_id`, `job: {id, name, status}` (the status when the event happened) "
        "and the event's own data (see Event.data)."
    )


class WebhookList(BaseModel):
    data: list[WebhookPublic]


class Delivery(BaseModel):
    id: int
    event_id: int
    event_type: str
    job_id: str
    webhook_id_header: str = Field(
        description="The `webhook-id` header it is sent with (the same on every try)."
    )
    status: str = Field(
        description="pending (will be tried at next_attempt_at), succeeded or failed (gave up)."
    )
    attempts: int
    last_status_code: int | None = Field(
        description="The receiver's HTTP status of the last try; null: no answer, or a receiver at an "
        "address that is not public (loopback, private: allowed by development or the operator), whose "
        "failures all read the same so that a tenant cannot probe such addresses."
    )
    last_error: str | None = Field(
        description="Why the last try failed. A refused address reads `refused: ...` without the address "
        "or the reason; a non-public receiver's failures read `the receiver did not accept the delivery`."
    )
    created_at: datetime
    last_attempt_at: datetime | None
    next_attempt_at: datetime | None


class DeliveryPage(BaseModel):
    data: list[Delivery]
    next_after: int


ArtifactKind = Literal["adapter", "model", "tokenizer", "checkpoint", "export", "log", "card", "other"]


class Artifact(BaseModel):
    path: str = Field(
        description="Relative to the run directory, e.g. `final/adapter_model.safetensors`, "
        "`checkpoints/checkpoint-20/optimizer.pt`, `exports/<export id>/model.safetensors`, `train.log`; "
        "download it from `GET /jobs/{id}/artifacts/{path}`."
    )
    size: int = Field(description="Bytes.")
    kind: ArtifactKind = Field(
        description="adapter (final/adapter_*), model (final/ weights and config), tokenizer (final/ "
        "tokenizer files), checkpoint (anything under checkpoints/), export (anything under exports/), "
        "log (train.log, metrics.jsonl, samples.jsonl), card (the model card README.md of final/ or an "
        "export), other (anything else in final/, e.g. training_args.bin)."
    )
    sha256: str | None = Field(
        description="Hex SHA-256 of the bytes a download returns. Computed once per version of the file "
        "(size, mtime, inode) and cached; null while a large file is still being hashed in the "
        "background (list again shortly). train.log is served with the operator's secrets masked "
        "(each byte of one replaced by `*`, so its size is unchanged): its sha256 is of the masked bytes."
    )


class ArtifactList(BaseModel):
    data: list[Artifact] = Field(
        description="Every file of the run a user may download, sorted by path. A folder downloads as "
        "one tar: `GET /jobs/{id}/artifacts/final.tar`, `.../checkpoints/checkpoint-20.tar`, "
        "`.../exports/<export id>.tar`."
    )


class FileError(BaseModel):
    line: int = Field(description="1-based line of the file (0: the file as a whole).")
    message: str


class FilePublic(BaseModel):
    """An uploaded dataset file (`POST /files`)."""

    id: str = Field(description="`file_<24 hex>`; name it in a spec as `dataset.file_id`.")
    filename: str = Field(
        description="The name it was uploaded under (shown only; the server chose the path)."
    )
    bytes: int
    sha256: str = Field(description="Hex SHA-256 of the bytes, computed while they were received.")
    status: FileStatus = Field(
        description="`validating` until the worker has read it, then `ready` (a job may train on it) or "
        "`invalid` (see `errors`)."
    )
    rows: int | None = Field(None, description="Rows (JSON objects), once validated.")
    columns: list[str] = Field(default_factory=list, description="Fields the rows hold (first 100).")
    formats: list[str] = Field(
        default_factory=list,
        description="Dataset formats every row holds: text, messages, prompt_completion, preference, "
        "unpaired_preference.",
    )
    methods: list[str] = Field(default_factory=list, description="training.method values the formats suit.")
    errors: list[FileError] = Field(
        default_factory=list, description="The first problems found (at most 20), with their lines."
    )
    error_count: int = Field(0, description="All the problems found (errors lists the first 20).")
    created_at: datetime


class FileList(BaseModel):
    data: list[FilePublic]
    next_cursor: str | None
