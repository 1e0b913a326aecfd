"""The job spec: the one schema the service and the trainer share.

The service validates a client's spec with `JobSpec`; the worker writes the validated spec (with local
paths resolved) into the run directory as `spec.json`; the trainer reads it back with `JobSpec` too.
So this module imports nothing heavy and nothing from `service/`, `worker/` or `trainer/`.

Every field is strict: unknown keys are refused, numbers have ranges, choices are enums, and rules that
span fields are checked here, so that a bad spec is a 422 at POST time and never a failed GPU job.
Strings that may reach a batch script (SLURM partition, account, time limit) are limited to the
characters such names can have; everything else reaches the trainer as data, never as a script line.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from ftq.contract.evaluation import (
    MAX_SUITES,
    EvalOn,
    NotBool,
    Select,
    Step,
    Suite,
    SuiteError,
    check_suites,
)
from ftq.contract.graders import Grader

# A hub id is `name` or `owner/name`; names are limited as the hub limits them.
HUB_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.\-]{0,95})?$"
# Partition, account, revision and split names: what SLURM and git allow, minus anything a shell reads.
SAFE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
# Column and module names: identifiers, optionally dotted (`model.layers.0.q_proj`).
IDENT_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,127}(\.[A-Za-z0-9_]{1,128}){0,16}$"
# SLURM --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
SLURM_TIME_RE = r"^(\d{1,5}|\d{1,5}:\d{2}|\d{1,4}:\d{2}:\d{2}|\d{1,3}-\d{1,2}(:\d{2}(:\d{2})?)?)$"

JobName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._\-]{1,64}$")]
SafeName = Annotated[str, StringConstraints(pattern=SAFE_NAME_RE)]
Ident = Annotated[str, StringConstraints(pattern=IDENT_RE)]
PathOrHubId = Annotated[str, StringConstraints(min_length=1, max_length=4096)]

LOCAL_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".arrow")


def looks_local(name_or_path: str) -> bool:
    """A name is a local path when it is written as one; anything else must be a hub id.

    Absolute paths and `./`, `../` relative ones are local; so is a bare data file name. The service
    resolves relative ones under the allowed roots (see `service.paths`).
    """
    return (
        name_or_path.startswith(("/", "./", "../"))
        or name_or_path in (".", "..")
        or name_or_path.lower().endswith(LOCAL_FILE_SUFFIXES)
    )


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, use_enum_values=True, validate_default=True)


class AttnImplementation(StrEnum):
    auto = "auto"
    flash_attention_2 = "flash_attention_2"
    flash_attention_3 = "flash_attention_3"
    sdpa = "sdpa"
    eager = "eager"


class MixedPrecision(StrEnum):
    bf16 = "bf16"
    fp16 = "fp16"
    no = "no"


class SaveDtype(StrEnum):
    auto = "auto"
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


def resolved_save_dtype(save_dtype: str, mixed_precision: str) -> str:
    """The dtype of a full fine-tune's final/ weights: `auto` is the training's compute dtype (bf16 or fp16
    under mixed precision), fp32 without it."""
    if save_dtype != SaveDtype.auto:
        return str(save_dtype)
    return {"bf16": "bf16", "fp16": "fp16"}.get(str(mixed_precision), "fp32")


class LRScheduler(StrEnum):
    linear = "linear"
    cosine = "cosine"
    cosine_with_restarts = "cosine_with_restarts"
    cosine_with_min_lr = "cosine_with_min_lr"
    polynomial = "polynomial"
    constant = "constant"
    constant_with_warmup = "constant_with_warmup"
    inverse_sqrt = "inverse_sqrt"
    warmup_stable_decay = "warmup_stable_decay"


class Strategy(StrEnum):
    none = "none"
    ddp = "ddp"
    fsdp = "fsdp"
    deepspeed = "deepspeed"


class Offload(StrEnum):
    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class Launcher(StrEnum):
    local = "local"
    slurm = "slurm"


class Device(StrEnum):
    cuda = "cuda"
    cpu = "cpu"


class Priority(StrEnum):
    low = "low"
    normal = "normal"
    high = "high"


# Higher ranks first; the scheduler and the operator's cap (FTQ_MAX_PRIORITY) compare these.
PRIORITY_RANK = {Priority.low: 0, Priority.normal: 1, Priority.high: 2}


class DatasetFormat(StrEnum):
    auto = "auto"  # what the method takes, read from the columns (see `auto_format`)
    text = "text"
    messages = "messages"
    prompt_completion = "prompt_completion"
    preference = "preference"
    unpaired_preference = "unpaired_preference"
    # OpenAI's fine-tuning files: preference (DPO) rows `{input: {messages}, preferred_output: [..],
    # non_preferred_output: [..]}`, read as conversational prompt/chosen/rejected; reinforcement rows
    # `{messages (no final assistant turn), <reference fields>}`, which grpo trains on (the messages are the
    # prompt, the other fields reach the grader as `item.<name>`).
    # OpenAI's chat rows are `messages` rows (with `weight` on assistant turns, `tool_calls`, `tools`).
    openai_preference = "openai_preference"
    openai_reinforcement = "openai_reinforcement"
    # A prompt alone (text or a conversation) for the model to complete; the other columns are the graders'.
    prompt_only = "prompt_only"


class Method(StrEnum):
    sft = "sft"
    dpo = "dpo"
    kto = "kto"
    reward = "reward"
    grpo = "grpo"


class LossOn(StrEnum):
    all = "all"
    completion = "completion"
    assistant = "assistant"


# The one table of data formats: the columns each needs (TRL's names; `text` and `messages` are renamed
# by dataset.text_field / dataset.messages_field), and which formats each method trains on. The spec's
# validation, the submit-time check of a local .jsonl file and the trainer all read it.
FORMAT_COLUMNS: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "messages": ("messages",),
    "prompt_completion": ("prompt", "completion"),
    # `prompt` may be left out when chosen/rejected are conversations sharing their first turns (TRL
    # takes the shared turns as the prompt).
    "preference": ("chosen", "rejected"),
    "unpaired_preference": ("prompt", "completion", "label"),
    "openai_preference": ("input", "preferred_output", "non_preferred_output"),
    "openai_reinforcement": ("messages",),
    "prompt_only": ("prompt",),
}
METHOD_FORMATS: dict[str, tuple[str, ...]] = {
    "sft": ("text", "messages", "prompt_completion"),
    "dpo": ("preference", "openai_preference"),
    "kto": ("unpaired_preference",),
    "reward": ("preference", "openai_preference"),
    # `prompt` rows, or OpenAI's reinforcement rows (`messages` that end before the assistant's turn).
    "grpo": ("prompt_only", "openai_reinforcement"),
}
# Which loss_on each SFT format can mask for (`all` always).
LOSS_ON_FORMATS: dict[str, tuple[str, ...]] = {
    "completion": ("prompt_completion",),
    "assistant": ("messages",),
}
# The TRL trainer each method runs (shown in the plan).
METHOD_TRAINERS: dict[str, str] = {
    "sft": "trl.SFTTrainer",
    "dpo": "trl.DPOTrainer",
    "kto": "trl.KTOTrainer",
    "reward": "trl.RewardTrainer",
    "grpo": "trl.GRPOTrainer",
}


def format_columns(fmt: str, text_field: str = "text", messages_field: str = "messages") -> tuple[str, ...]:
    """The columns a format needs, with the spec's own names for text and messages."""
    rename = {"text": text_field, "messages": messages_field}
    return tuple(rename.get(c, c) for c in FORMAT_COLUMNS[fmt])


def auto_format(
    method: str, columns: set[str] | list[str], text_field: str = "text", messages_field: str = "messages"
) -> str:
    """`dataset.format: auto` for a method, from the dataset's columns: the first of the method's formats
    whose columns are all there (for SFT: messages, then text, then prompt/completion); the method's first
    format when none is (the caller then names the missing columns)."""
    present = set(columns)
    order = {"sft": ("messages", "text", "prompt_completion")}.get(method, METHOD_FORMATS[method])
    for fmt in order:
        if set(format_columns(fmt, text_field, messages_field)) <= present:
            return fmt
    return "text" if method == "sft" else METHOD_FORMATS[method][0]


class ModelSpec(_Strict):
    name_or_path: PathOrHubId = Field(
        description="Hub id (`owner/name`) or a local path under FTQ_LOCAL_ROOTS."
    )
    revision: SafeName | None = None
    trust_remote_code: bool = False
    attn_implementation: AttnImplementation = Field(
        AttnImplementation.auto,
        description=(
            "`auto`: flash_attention_2 when the job runs on cuda in bf16/fp16 and flash-attn imports on "
            "the node, else sdpa. flash_attention_2/3 need resources.device cuda and mixed_precision bf16 "
            "or fp16."
        ),
    )

    adapter: PathOrHubId | None = Field(
        None,
        description=(
            "A LoRA adapter to go on training (the `final/` folder of a LoRA job of yours, a local path or "
            "a hub id): loaded onto `name_or_path`, its weights trainable. Needs `lora`; the adapter's own "
            "r, alpha and modules apply."
        ),
    )

    @field_validator("name_or_path", "adapter")
    @classmethod
    def _hub_id_or_path(cls, v: str | None) -> str | None:
        return None if v is None else _check_hub_id_or_path(v)


FileId = Annotated[str, StringConstraints(pattern=r"^file_[0-9a-f]{24}$")]


class DatasetSpec(_Strict):
    name_or_path: PathOrHubId | None = Field(
        None,
        description=(
            "Hub id, a local dataset dir (save_to_disk or data files), or a .jsonl/.json/.parquet file. "
            "Give this or `file_id`, not both."
        ),
    )
    file_id: FileId | None = Field(
        None,
        description="An uploaded file (`POST /files`, status `ready`) to train on, instead of "
        "`name_or_path`.",
    )
    eval_file_id: FileId | None = Field(
        None,
        description="An uploaded file to evaluate on (with `file_id`); it becomes the `eval` split, so "
        "leave `eval_split` unset or `eval`.",
    )
    format: DatasetFormat = DatasetFormat.auto
    text_field: Ident = "text"
    messages_field: Ident = "messages"
    train_split: SafeName = "train"
    eval_split: SafeName | None = None

    @field_validator("name_or_path")
    @classmethod
    def _hub_id_or_path(cls, v: str | None) -> str | None:
        return None if v is None else _check_hub_id_or_path(v)

    @model_validator(mode="after")
    def _one_source(self) -> DatasetSpec:
        if self.name_or_path is None and self.file_id is None:
            raise _field_error(("file_id",), "give dataset.name_or_path or dataset.file_id")
        if self.name_or_path is not None and self.file_id is not None:
            raise _field_error(("file_id",), "give dataset.name_or_path or dataset.file_id, not both")
        if self.eval_file_id is not None:
            if self.file_id is None:
                raise _field_error(
                    ("eval_file_id",), "eval_file_id needs dataset.file_id (an uploaded training file)"
                )
            if self.eval_split not in (None, "eval"):
                raise _field_error(
                    ("eval_split",), "eval_file_id is the eval split (`eval`); leave eval_split unset"
                )
            self.eval_split = "eval"
        return self

    @property
    def source(self) -> str:
        """What the data is, in words: the file id or the hub id or path."""
        return self.file_id or self.name_or_path or ""


def _check_hub_id_or_path(v: str) -> str:
    if "\x00" in v or "\n" in v or "\r" in v:
        raise ValueError("must not contain NUL or line breaks")
    if looks_local(v):
        return v
    if not re.match(HUB_ID_RE, v) or ".." in v:
        raise ValueError(
            "must be a hub id like `owner/name`, or a local path written as `/abs/path` or `./relative/path`"
        )
    return v


class DpoLossType(StrEnum):
    sigmoid = "sigmoid"
    hinge = "hinge"
    ipo = "ipo"
    exo_pair = "exo_pair"
    nca_pair = "nca_pair"
    robust = "robust"
    bco_pair = "bco_pair"
    sppo_hard = "sppo_hard"
    aot = "aot"
    aot_unpaired = "aot_unpaired"
    apo_zero = "apo_zero"
    apo_down = "apo_down"
    discopop = "discopop"
    sft = "sft"
    sigmoid_norm = "sigmoid_norm"


class DpoSpec(_Strict):
    """TRL's DPOConfig fields a job may set (the rest come from `training`)."""

    beta: float = Field(
        0.1, gt=0, le=100, description="How far the policy may move from the reference; higher stays closer."
    )
    loss_type: DpoLossType | list[DpoLossType] = Field(
        DpoLossType.sigmoid,
        description="TRL's DPO loss, or a list of them combined with `loss_weights` (e.g. MPO).",
    )
    loss_weights: list[Annotated[float, Field(ge=0, le=1000)]] | None = Field(
        None, description="One weight per loss_type when several are given (default 1.0 each)."
    )
    label_smoothing: float = Field(
        0.0,
        ge=0,
        lt=0.5,
        description="Robust DPO: the probability a preference label is flipped; EXO: epsilon.",
    )
    ld_alpha: float | None = Field(
        None, ge=0, le=1, description="LD-DPO weighting of the tokens beyond the shorter response's length."
    )
    use_weighting: bool = Field(False, description="WPO weighting of the pairs.")
    precompute_ref_log_probs: bool = Field(
        False,
        description="Compute the reference's log-probabilities once before training, so that full "
        "fine-tuning does not keep a reference model in memory while it trains.",
    )
    sync_ref_model: bool = Field(
        False,
        description="TR-DPO: mix the policy into the reference every ref_model_sync_steps (not with LoRA).",
    )
    ref_model_mixup_alpha: float = Field(0.6, ge=0, le=1)
    ref_model_sync_steps: int = Field(512, ge=1, le=100_000_000)

    @model_validator(mode="after")
    def _consistent(self) -> DpoSpec:
        kinds = self.loss_type if isinstance(self.loss_type, list) else [self.loss_type]
        if not kinds:
            raise _field_error(("loss_type",), "name at least one loss type")
        if self.loss_weights is not None and len(self.loss_weights) != len(kinds):
            raise _field_error(
                ("loss_weights",),
                f"give one weight per loss_type ({len(kinds)}), not {len(self.loss_weights)}",
            )
        if self.sync_ref_model and self.precompute_ref_log_probs:
            raise _field_error(
                ("sync_ref_model",),
                "sync_ref_model changes the reference, so its log-probs cannot be precomputed",
            )
        return self


class KtoLossType(StrEnum):
    kto = "kto"
    apo_zero_unpaired = "apo_zero_unpaired"


class KtoSpec(_Strict):
    """TRL's KTOConfig fields a job may set."""

    beta: float = Field(0.1, gt=0, le=100, description="How far the policy may move from the reference.")
    loss_type: KtoLossType = KtoLossType.kto
    desirable_weight: float = Field(
        1.0, gt=0, le=1000, description="Weight of the desirable (label true) examples' losses."
    )
    undesirable_weight: float = Field(
        1.0, gt=0, le=1000, description="Weight of the undesirable (label false) examples' losses."
    )
    precompute_ref_log_probs: bool = False


class RewardSpec(_Strict):
    """TRL's RewardConfig fields a job may set."""

    center_rewards_coefficient: float | None = Field(
        None,
        ge=0,
        le=1000,
        description="Pushes the reward model's outputs towards zero mean (1e-2 is the paper's value).",
    )


class GrpoLossType(StrEnum):
    grpo = "grpo"
    dr_grpo = "dr_grpo"
    dapo = "dapo"
    bnpo = "bnpo"
    cispo = "cispo"
    sapo = "sapo"
    luspo = "luspo"
    vespo = "vespo"


class ScaleRewards(StrEnum):
    group = "group"
    batch = "batch"
    none = "none"


class ImportanceSamplingLevel(StrEnum):
    token = "token"  # noqa: S105 (a level's name, not a secret)
    sequence = "sequence"


class GrpoSpec(_Strict):
    """TRL's GRPOConfig fields a job may set (the rest come from `training`; the reward is
    `training.grader`)."""

    num_generations: int = Field(
        8,
        ge=2,
        le=1024,
        description="Completions sampled per prompt; their rewards are compared within the group. "
        "per_device_train_batch_size x processes x steps_per_generation must be a multiple of it.",
    )
    max_completion_length: int = Field(
        256, ge=1, le=131_072, description="The most tokens a completion may have (generation stops there)."
    )
    beta: float = Field(
        0.0,
        ge=0,
        le=100,
        description="Weight of the KL term against the reference model; 0 (TRL's default) loads no "
        "reference and logs no `kl`.",
    )
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature of the generation.")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, le=1_000_000, description="0: no top-k filtering.")
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0, le=10)
    loss_type: GrpoLossType = Field(
        GrpoLossType.dapo,
        description="TRL's loss: grpo, dr_grpo, dapo (default), bnpo, cispo, sapo, luspo (needs "
        "importance_sampling_level sequence), vespo.",
    )
    epsilon: float = Field(0.2, gt=0, le=10, description="Clipping range of the policy ratio (lower side).")
    epsilon_high: float | None = Field(
        None, gt=0, le=10, description="Upper clipping range (DAPO's clip-higher); unset: epsilon."
    )
    delta: float | None = Field(None, gt=1, le=1000, description="Two-sided clipping's upper bound.")
    num_iterations: int = Field(
        1, ge=1, le=64, description="Optimisation passes over each generated batch (GRPO's mu)."
    )
    steps_per_generation: int | None = Field(
        None,
        ge=1,
        le=65_536,
        description="Optimizer steps each generation batch feeds; unset: gradient_accumulation_steps.",
    )
    scale_rewards: ScaleRewards = Field(
        ScaleRewards.group,
        description="Advantages divided by the rewards' std within each group, across the batch, or none.",
    )
    importance_sampling_level: ImportanceSamplingLevel = ImportanceSamplingLevel.token
    mask_truncated_completions: bool = Field(
        False, description="Leave completions cut at max_completion_length out of the loss."
    )
    sync_ref_model: bool = Field(
        False, description="Mix the policy into the reference every ref_model_sync_steps (needs beta > 0)."
    )
    ref_model_mixup_alpha: float = Field(0.6, ge=0, le=1)
    ref_model_sync_steps: int = Field(512, ge=1, le=100_000_000)
    use_vllm: bool = Field(
        False,
        description="Generate with vLLM in the training processes (TRL's colocate mode): CUDA only, and "
        "vllm installed on the server.",
    )
    vllm_gpu_memory_utilization: float = Field(
        0.3, gt=0, le=1, description="The share of each GPU's memory vLLM may take (use_vllm)."
    )
    use_transformers_continuous_batching: bool | None = Field(
        None,
        description="Generate with transformers' continuous batching (paged KV cache, the batch refilled as "
        "completions end) instead of padded generate(). Unset: on for a cuda job without use_vllm whose "
        "weights are not sharded over several processes. Refused (true) under FSDP or ZeRO-3 on more than "
        "one process: continuous batching ignores synced_gpus, and sharded ranks must generate in lockstep.",
    )
    rollouts_per_log: int = Field(
        4,
        ge=0,
        le=64,
        description="ftq's own: rollouts (prompt, completion, reward) of each logging step written to the "
        "job's samples (GET /jobs/{id}/samples); 0: none.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> GrpoSpec:
        if self.loss_type == GrpoLossType.luspo and self.importance_sampling_level != "sequence":
            raise _field_error(
                ("importance_sampling_level",), "loss_type luspo needs importance_sampling_level: sequence"
            )
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            raise _field_error(("epsilon_high",), "epsilon_high must be at least epsilon")
        if self.sync_ref_model and self.beta == 0:
            raise _field_error(
                ("sync_ref_model",), "sync_ref_model updates the reference, and beta 0 loads none; set beta"
            )
        return self

    def steps_per_generation_or(self, gradient_accumulation_steps: int) -> int:
        return self.steps_per_generation or gradient_accumulation_steps


METHOD_PARAMETERS: dict[str, type[_Strict]] = {
    "dpo": DpoSpec,
    "kto": KtoSpec,
    "reward": RewardSpec,
    "grpo": GrpoSpec,
}


class TrainingSpec(_Strict):
    method: Method = Field(
        Method.sft,
        description="sft (supervised), dpo (preference pairs), kto (unpaired preferences), reward (a reward "
        "model: a sequence classification head scoring chosen above rejected), grpo (reinforcement "
        "learning from the rewards of `grader`).",
    )
    loss_on: LossOn = Field(
        LossOn.all,
        description="Which tokens carry the SFT loss: all; completion (prompt_completion data: the "
        "completion only); assistant (messages data: the assistant turns only; the chat template must "
        "mark them with {% generation %}). Preference methods always score the completions.",
    )
    dpo: DpoSpec | None = Field(None, description="DPO parameters (training.method: dpo only).")
    kto: KtoSpec | None = Field(None, description="KTO parameters (training.method: kto only).")
    reward: RewardSpec | None = Field(
        None, description="Reward model parameters (training.method: reward only)."
    )
    grpo: GrpoSpec | None = Field(None, description="GRPO parameters (training.method: grpo only).")
    grader: Grader | None = Field(
        None,
        description="The reward of training.method grpo: one grader in OpenAI's grader JSON (string_check, "
        "text_similarity, python, score_model) or a multi grader; each completion is `sample`, its "
        "dataset row `item` (see docs/graders.md). Required for grpo, refused otherwise.",
    )
    max_seq_len: int = Field(2048, ge=8, le=1_048_576)
    max_steps: int | None = Field(None, ge=1, le=100_000_000)
    num_train_epochs: float | None = Field(None, gt=0, le=10_000)
    per_device_train_batch_size: int = Field(1, ge=1, le=4096)
    per_device_eval_batch_size: int | None = Field(None, ge=1, le=4096)
    gradient_accumulation_steps: int = Field(1, ge=1, le=65_536)
    learning_rate: float = Field(5.0e-5, gt=0, le=1.0)
    lr_scheduler_type: LRScheduler = LRScheduler.cosine
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0, le=10)
    max_grad_norm: float = Field(1.0, ge=0, le=1e6)
    logging_steps: int = Field(10, ge=1, le=1_000_000)
    eval_steps: int | None = Field(None, ge=1, le=1_000_000)
    save_steps: int | None = Field(500, ge=1, le=1_000_000)
    save_total_limit: int | None = Field(None, ge=1, le=10_000)
    packing: bool = False
    gradient_checkpointing: bool = False
    mixed_precision: MixedPrecision = MixedPrecision.bf16
    save_dtype: SaveDtype = Field(
        SaveDtype.auto,
        description="The dtype of a full fine-tune's final/ weights: bf16, fp16, fp32, or auto (the "
        "training's mixed_precision dtype: bf16 when training in bf16; fp32 with mixed_precision no). A "
        "LoRA adapter is saved in fp32 whatever this says (it is small); checkpoints keep full precision.",
    )
    seed: int = Field(42, ge=0, le=2**32 - 1)
    stop_on_nan: bool = Field(
        True,
        description="Stop a run whose loss becomes NaN or infinite, or explodes (over loss_spike_factor "
        "times its first logged value for 3 logging steps in a row), with error code `diverged`, keeping "
        "its last good checkpoint (no save of the NaN weights); false: warn (job.warning) and train on.",
    )
    loss_spike_factor: float | None = Field(
        4.0,
        gt=1,
        le=1e6,
        description="A logged loss above this many times the median of the last 50 logged losses is a "
        "job.warning event (loss_spike); above this many times the run's first loss for 3 logging steps, "
        "the loss is exploding (see stop_on_nan); null: neither check. Not applied to grpo, whose loss is "
        "a policy-gradient surrogate near zero.",
    )

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> TrainingSpec:
        if self.max_steps is None and self.num_train_epochs is None:
            raise ValueError("set one of max_steps or num_train_epochs")
        if self.max_steps is not None and self.num_train_epochs is not None:
            raise ValueError("set max_steps or num_train_epochs, not both")
        for block in METHOD_PARAMETERS:
            if getattr(self, block) is not None and self.method != block:
                raise _field_error(
                    (block,), f"training.{block} is for method {block}, and training.method is {self.method}"
                )
        if self.method != Method.sft and self.loss_on != LossOn.all:
            raise _field_error(
                ("loss_on",),
                f"loss_on is for method sft; {self.method} always scores the completions "
                "(leave loss_on: all)",
            )
        if (
            self.method == Method.kto
            and self.per_device_train_batch_size < 2
            and self.kto_loss != "apo_zero_unpaired"
        ):
            # KTO's KL term pairs each example with another completion of the same batch.
            raise _field_error(
                ("per_device_train_batch_size",),
                "KTO (loss_type kto) needs per_device_train_batch_size of at least 2: its KL estimate "
                "pairs each example with another completion of the same batch",
            )
        if self.method != Method.sft and self.packing:
            raise _field_error(("packing",), f"packing is for method sft, not {self.method}")
        if self.method == Method.grpo and self.grader is None:
            raise _field_error(("grader",), "training.method grpo needs a grader (the reward it learns from)")
        if self.method != Method.grpo and self.grader is not None:
            raise _field_error(("grader",), f"training.grader is for method grpo, not {self.method}")
        return self

    @property
    def kto_loss(self) -> str:
        return str(self.kto.loss_type) if self.kto is not None else "kto"

    def method_parameters(self) -> DpoSpec | KtoSpec | RewardSpec | GrpoSpec | None:
        """The method's own block, with its defaults when the spec left it out (None for sft)."""
        if self.method == Method.dpo:
            return self.dpo or DpoSpec()
        if self.method == Method.kto:
            return self.kto or KtoSpec()
        if self.method == Method.reward:
            return self.reward or RewardSpec()
        if self.method == Method.grpo:
            return self.grpo or GrpoSpec()
        return None


class QuantizationSpec(_Strict):
    """QLoRA: the frozen base weights in 4 bits (bitsandbytes), the adapters trained on top."""

    bits: Literal[4] = 4
    type: Literal["nf4", "fp4"] = Field("nf4", description="4-bit data type: nf4 (QLoRA's) or fp4.")
    double_quant: bool = Field(True, description="Quantize the quantization constants too (~0.4 bit/param).")
    compute_dtype: Literal["bf16", "fp16", "fp32"] = Field(
        "bf16", description="The dtype the 4-bit weights are dequantized to for each matmul."
    )


class LoraSpec(_Strict):
    r: int = Field(16, ge=1, le=4096)
    alpha: float = Field(32, gt=0, le=65_536)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[Ident] | Literal["all-linear"] = Field(
        "all-linear", description="Module names (e.g. [q_proj, v_proj]) or `all-linear`."
    )
    quantization: QuantizationSpec | None = Field(
        None,
        description="QLoRA: load the base model's linear layers in 4 bits with bitsandbytes ({bits: 4, "
        "type: nf4, double_quant: true, compute_dtype: bf16}); cuda only, with strategy none, ddp or "
        "DeepSpeed ZeRO without parameter offload.",
    )

    @field_validator("target_modules")
    @classmethod
    def _non_empty(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, list):
            if not v:
                raise ValueError("name at least one module, or use `all-linear`")
            if len(v) > 256:
                raise ValueError("at most 256 modules")
        return v


class DeepSpeedSpec(_Strict):
    zero_stage: int = Field(3, ge=0, le=3)
    offload_optimizer: Offload = Offload.none
    offload_params: Offload = Offload.none
    zero3_init: bool = True
    save_16bit_model: bool = True
    hpz_partition_size: int | None = Field(
        None,
        ge=1,
        le=128,
        description="ZeRO++ hierarchical partitioning (zero_hpz_partition_size): a second copy of the 16-bit "
        "weights sharded over this many GPUs (a node's), so the weight all-gathers stay inside the node. "
        "Unset: the estimate decides (a node's GPUs on several nodes where the copy fits); 1: off.",
    )

    @model_validator(mode="after")
    def _offload_needs_stage(self) -> DeepSpeedSpec:
        if self.offload_params != Offload.none and self.zero_stage != 3:
            raise ValueError("offload_params needs zero_stage 3")
        if self.offload_optimizer != Offload.none and self.zero_stage == 0:
            raise ValueError("offload_optimizer needs zero_stage 1, 2 or 3")
        return self


class FsdpSpec(_Strict):
    version: Literal[1, 2] = 2
    reshard_after_forward: bool = True
    cpu_ram_efficient_loading: bool = True
    state_dict_type: Literal["sharded", "full"] = "sharded"
    offload_params: bool = False
    activation_checkpointing: bool = False
    hybrid_shard: bool | None = Field(
        None,
        description="HSDP on several nodes: shard within each node and replicate across nodes, so the "
        "weight all-gathers of every micro-batch stay on NVLink and only gradients cross the network. "
        "Unset: the estimate decides (on where one node's shard fits in memory); false: shard over all GPUs.",
    )
    context_parallel_size: int = Field(
        1,
        ge=1,
        le=64,
        description="Context parallelism (FSDP2, accelerate's ParallelismConfig cp_size): each sequence "
        "split over this many GPUs of a node, for long sequences (32k-128k tokens) whose activations do "
        "not fit one GPU. Divides processes_per_node; the sequences trained per step are divided by it.",
    )
    sync_each_batch: bool | None = Field(
        None,
        description="Reduce-scatter the gradients at every micro-batch of gradient accumulation "
        "(accelerate's GradientAccumulationPlugin sync_each_batch) instead of keeping full-size gradients "
        "on every GPU until the last one. Unset: on for full fine-tuning with "
        "gradient_accumulation_steps > 1.",
    )

    @model_validator(mode="after")
    def _context_parallel_needs_fsdp2(self) -> FsdpSpec:
        if self.context_parallel_size > 1 and self.version != 2:
            raise _field_error(("context_parallel_size",), "context_parallel_size > 1 needs FSDP version 2")
        return self


class DistributedSpec(_Strict):
    strategy: Strategy = Strategy.none
    deepspeed: DeepSpeedSpec = Field(default_factory=DeepSpeedSpec)
    fsdp: FsdpSpec = Field(default_factory=FsdpSpec)


class SlurmSpec(_Strict):
    partition: SafeName | None = None
    account: SafeName | None = None
    time_limit: Annotated[str, StringConstraints(pattern=SLURM_TIME_RE)] | None = Field(
        None, description="SLURM --time: M, M:S, H:M:S, D-H, D-H:M or D-H:M:S."
    )
    requeue_on_timeout: bool = Field(
        False,
        description="When the job reaches its time_limit: it checkpoints shortly before (SLURM warns it the "
        "operator's FTQ_SLURM_SIGNAL_GRACE_SECONDS ahead), is queued again and resumes from that checkpoint, "
        "for as long as each attempt gets further than the one before. Off: it fails with time_limit.",
    )


class ResourcesSpec(_Strict):
    launcher: Launcher = Launcher.local
    device: Device = Device.cuda
    num_nodes: int = Field(1, ge=1, le=1024)
    processes_per_node: int = Field(1, ge=1, le=128)
    max_seconds: int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description="How long a local job may run: the worker stops it then (it fails with time_limit). "
        "The scheduler plans with it: a job that says it ends soon may start in a gap that a larger job "
        "waits for (backfill). Unset: the operator's cap (FTQ_MAX_TIME_LIMIT_HOURS). For SLURM use "
        "slurm.time_limit.",
    )
    slurm: SlurmSpec = Field(default_factory=SlurmSpec)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.processes_per_node

    @model_validator(mode="after")
    def _requeue_needs_slurm(self) -> ResourcesSpec:
        if self.max_seconds is not None and self.launcher != Launcher.local:
            raise _field_error(
                ("max_seconds",), "max_seconds is for local jobs; on SLURM use resources.slurm.time_limit"
            )
        if self.slurm.requeue_on_timeout and self.launcher != Launcher.slurm:
            # A local job's time limit is the operator's cap (FTQ_MAX_TIME_LIMIT_HOURS): not to be renewed.
            raise _field_error(
                ("slurm", "requeue_on_timeout"), "requeue_on_timeout needs resources.launcher: slurm"
            )
        return self


# Samples: a few prompts, each generated greedily at every evaluation and at the end. Bounded so that
# sampling stays a small fraction of a run (every prompt is a full forward per new token on every rank
# of a sharded model).
MAX_SAMPLE_PROMPTS = 8
MAX_SAMPLE_PROMPT_CHARS = 2000
MAX_SAMPLE_NEW_TOKENS = 512

SamplePrompt = Annotated[str, StringConstraints(min_length=1, max_length=MAX_SAMPLE_PROMPT_CHARS)]


class EvalSpec(_Strict):
    sample_prompts: list[SamplePrompt] = Field(
        default_factory=list,
        max_length=MAX_SAMPLE_PROMPTS,
        description=(
            f"Up to {MAX_SAMPLE_PROMPTS} prompts (each 1 to {MAX_SAMPLE_PROMPT_CHARS} characters). The "
            "trainer completes each greedily at every evaluation (with an eval split), else every "
            "training.eval_steps (or, unset, every save_steps) steps, and once at the end; the completions "
            "are served by GET /jobs/{id}/samples. A chat dataset's prompts go through the chat template "
            "as one user turn."
        ),
    )
    sample_max_new_tokens: int = Field(
        64, ge=1, le=MAX_SAMPLE_NEW_TOKENS, description="Tokens generated per prompt (greedy; stops at EOS)."
    )
    suites: list[Suite] = Field(
        default_factory=list,
        max_length=MAX_SUITES,
        description="Evaluation suites (graders | lm_eval | loss), each run on a saved checkpoint as a run "
        "of its own (see docs/evaluation.md); metrics `<suite>/score`, `<suite>/<task>/<metric>`, "
        "`<suite>/loss`.",
    )
    on: EvalOn = Field(
        EvalOn.final,
        description="checkpoint: every saved checkpoint is evaluated (and final/ after success); final: "
        "only final/, once the job succeeded.",
    )
    select: Select | None = Field(
        None, description="The metric that picks the best checkpoint (`best_checkpoint`), max or min."
    )

    @model_validator(mode="after")
    def _suites_and_select(self) -> EvalSpec:
        if self.select is not None and not self.suites:
            raise _field_error(("select",), "select needs eval.suites to score checkpoints with")
        try:
            check_suites(self.suites, self.select)
        except SuiteError as e:
            raise _field_error(e.loc, str(e)) from None
        return self

    @field_validator("sample_prompts")
    @classmethod
    def _printable(cls, v: list[str]) -> list[str]:
        for i, prompt in enumerate(v):
            if "\x00" in prompt:
                raise ValueError(f"prompt {i} contains a NUL character")
            if not prompt.strip():
                raise ValueError(f"prompt {i} is blank")
        return v


# W&B names: projects and entities are slugs; tags are short labels.
TRACKER_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
TrackerName = Annotated[str, StringConstraints(pattern=TRACKER_NAME_RE)]
TrackerTag = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/=+\-]{0,63}$")]
MlflowExperiment = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9/][A-Za-z0-9_.\-/ ]{0,254}$")]


class WandbSpec(_Strict):
    project: TrackerName = Field(description="The W&B project the run is logged to.")
    entity: TrackerName | None = Field(None, description="The W&B team or user; unset: the key's default.")
    tags: list[TrackerTag] = Field(default_factory=list, max_length=32, description="Tags of the W&B run.")


class MlflowSpec(_Strict):
    experiment: MlflowExperiment = Field(
        description="The MLflow experiment the run is logged to (made when it does not exist)."
    )


class IntegrationsSpec(_Strict):
    wandb: WandbSpec | None = Field(
        None,
        description="Log to Weights & Biases. The key (WANDB_API_KEY in FTQ_PASS_ENV) and the mode "
        "(FTQ_WANDB_MODE) are the operator's, never the spec's.",
    )
    mlflow: MlflowSpec | None = Field(
        None, description="Log to the operator's MLflow tracking server (FTQ_MLFLOW_TRACKING_URI)."
    )
    tensorboard: bool = Field(False, description="Write TensorBoard event files to the run's `tensorboard/`.")

    @property
    def report_to(self) -> list[str]:
        """transformers' `report_to` names of the trackers asked for."""
        names = []
        if self.wandb is not None:
            names.append("wandb")
        if self.mlflow is not None:
            names.append("mlflow")
        if self.tensorboard:
            names.append("tensorboard")
        return names


class ResumeFrom(_Strict):
    job_id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_\-]{1,64}$")]
    checkpoint: Annotated[Literal["latest"] | Step, NotBool] = "latest"


class JobSpec(_Strict):
    name: JobName | None = None
    model: ModelSpec
    dataset: DatasetSpec
    training: TrainingSpec
    lora: LoraSpec | None = None
    distributed: DistributedSpec = Field(default_factory=DistributedSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    resume_from: ResumeFrom | None = None
    eval: EvalSpec = Field(
        default_factory=EvalSpec,
        description="Samples of the model's output during training, and evaluation suites that score its "
        "checkpoints (docs/evaluation.md).",
    )
    integrations: IntegrationsSpec = Field(
        default_factory=IntegrationsSpec, description="Experiment trackers the trainer reports to."
    )
    priority: Priority = Field(
        Priority.normal,
        description="low | normal | high. Locally: higher first, then the owner using the fewest devices "
        "(weighted by recent usage), then the oldest. On SLURM: low is a positive --nice, high the "
        "operator's QOS (FTQ_SLURM_QOS_HIGH). The operator caps it per owner (FTQ_MAX_PRIORITY).",
    )
    allow_oversubscribe: bool = Field(
        False, description="Launch even when the memory estimate says the job will not fit."
    )

    def _check_quantization(self) -> None:
        """Where 4-bit base weights (bitsandbytes) cannot run, a 422 naming lora.quantization."""
        loc = ("lora", "quantization")
        res, dist = self.resources, self.distributed
        # bitsandbytes has CPU kernels for 4-bit weights (one process, or DDP); sharding them is CUDA's.
        if res.device != Device.cuda and dist.strategy not in (Strategy.none, Strategy.ddp):
            raise _field_error(
                loc,
                f"4-bit base weights under {dist.strategy} need resources.device: cuda (on cpu, QLoRA "
                "runs on one process or under ddp)",
            )
        if dist.strategy == Strategy.fsdp:
            raise _field_error(
                loc,
                "QLoRA under FSDP is not supported here (its 4-bit weights and RAM-efficient loading are "
                "untested together); use distributed.strategy deepspeed (ZeRO-3 shards the 4-bit weights) "
                "or ddp",
            )
        if dist.strategy == Strategy.deepspeed and dist.deepspeed.offload_params != Offload.none:
            raise _field_error(
                loc,
                "4-bit weights cannot be offloaded by DeepSpeed; "
                "set distributed.deepspeed.offload_params: none",
            )

    def _check_grpo(self) -> None:
        """TRL's rules for a GRPO batch, and where vLLM can generate, as 422s naming the field."""
        tr, res = self.training, self.resources
        grpo = tr.grpo or GrpoSpec()
        steps = grpo.steps_per_generation_or(tr.gradient_accumulation_steps)
        batch = tr.per_device_train_batch_size * res.world_size * steps
        if batch % grpo.num_generations != 0:
            # TRL's generation batch holds whole groups of num_generations completions of one prompt.
            raise _field_error(
                ("training", "grpo", "num_generations"),
                f"the generation batch (per_device_train_batch_size {tr.per_device_train_batch_size} x "
                f"{res.world_size} process(es) x steps_per_generation {steps} = {batch}) must be a multiple "
                f"of num_generations {grpo.num_generations}",
            )
        if tr.eval_steps is not None and self.dataset.eval_split is not None:
            eval_batch = (tr.per_device_eval_batch_size or tr.per_device_train_batch_size) * res.world_size
            if eval_batch % grpo.num_generations != 0:
                raise _field_error(
                    ("training", "per_device_eval_batch_size"),
                    f"the eval batch ({eval_batch} over all processes) must be a multiple of num_generations "
                    f"{grpo.num_generations}",
                )
        if grpo.use_vllm and res.device != Device.cuda:
            raise _field_error(
                ("training", "grpo", "use_vllm"),
                "use_vllm needs resources.device: cuda (vLLM has no CPU path here)",
            )
        if grpo.beta == 0 and grpo.sync_ref_model:
            raise _field_error(("training", "grpo", "sync_ref_model"), "sync_ref_model needs beta > 0")
        if grpo.sync_ref_model and self.lora is not None:
            raise _field_error(
                ("training", "grpo", "sync_ref_model"),
                "sync_ref_model needs full fine-tuning: with LoRA the reference is the base model with the "
                "adapter disabled",
            )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> JobSpec:
        res, dist, tr = self.resources, self.distributed, self.training
        if res.num_nodes > 1 and res.launcher != Launcher.slurm:
            raise _field_error(("resources", "num_nodes"), "num_nodes > 1 needs resources.launcher: slurm")
        if dist.strategy == Strategy.none and res.world_size > 1:
            raise _field_error(
                ("distributed", "strategy"),
                "strategy none runs a single process; use ddp, fsdp or deepspeed for "
                f"{res.world_size} processes",
            )
        if self.model.attn_implementation in ("flash_attention_2", "flash_attention_3") and (
            res.device != Device.cuda
        ):
            raise _field_error(
                ("model", "attn_implementation"),
                f"{self.model.attn_implementation} needs resources.device: cuda; use sdpa or auto on cpu",
            )
        if (
            self.model.attn_implementation in ("flash_attention_2", "flash_attention_3")
            and tr.mixed_precision == MixedPrecision.no
        ):
            # flash-attn kernels exist only for fp16/bf16; with float32 weights and no autocast the first
            # forward raises inside the job, after the queue and the model load.
            raise _field_error(
                ("model", "attn_implementation"),
                f"{self.model.attn_implementation} computes in fp16/bf16 only, and "
                "training.mixed_precision is no; set mixed_precision: bf16 (or fp16), or use sdpa or auto",
            )
        if tr.mixed_precision == MixedPrecision.fp16 and res.device == Device.cpu:
            raise _field_error(("training", "mixed_precision"), "fp16 needs cuda; use bf16 or no on cpu")
        if self.lora is not None and self.lora.quantization is not None:
            self._check_quantization()
        if (
            tr.save_dtype == SaveDtype.fp32
            and self.lora is None
            and dist.strategy == Strategy.deepspeed
            and dist.deepspeed.zero_stage == 3
            and tr.mixed_precision != MixedPrecision.no
        ):
            # ZeRO-3's final gather is of the 16-bit weights: an fp32 final/ would be upcast bf16 values.
            raise _field_error(
                ("training", "save_dtype"),
                "save_dtype fp32 under ZeRO-3 with mixed precision: the final save gathers the 16-bit "
                "weights; use auto (or bf16/fp16), or FSDP for an fp32 final/",
            )
        if (
            dist.strategy == Strategy.fsdp
            and dist.fsdp.activation_checkpointing
            and tr.gradient_checkpointing
        ):
            raise _field_error(
                ("distributed", "fsdp", "activation_checkpointing"),
                "FSDP activation_checkpointing and training.gradient_checkpointing cannot both be on "
                "(transformers refuses the pair); keep one",
            )
        if tr.method == Method.grpo:
            grpo = tr.grpo or GrpoSpec()
            # Weights sharded over several processes: every rank must run as many generation forwards as
            # the slowest (synced_gpus; each forward gathers the layers), which continuous batching ignores.
            sharded = res.world_size > 1 and (
                dist.strategy == Strategy.fsdp
                or (dist.strategy == Strategy.deepspeed and dist.deepspeed.zero_stage == 3)
            )
            if grpo.use_transformers_continuous_batching and sharded and not grpo.use_vllm:
                how = "FSDP" if dist.strategy == Strategy.fsdp else "ZeRO-3"
                raise _field_error(
                    ("training", "grpo", "use_transformers_continuous_batching"),
                    f"transformers' continuous batching ignores synced_gpus, and under {how} on "
                    f"{res.world_size} processes each generation forward gathers the sharded weights: the "
                    "ranks must generate in lockstep (padded generate()), or their collectives pair up "
                    "across different forwards; set it false (or leave it unset), or use_vllm: true",
                )
            if grpo.use_transformers_continuous_batching is None:
                # Unset: transformers' continuous batching (paged KV cache, the batch refilled as
                # completions end) on a GPU without vLLM and without sharded weights, instead of padded
                # generate(); TRL 1.x's GRPOConfig reads the field by this name. Resolved here so the
                # stored spec says it.
                grpo.use_transformers_continuous_batching = (
                    res.device == Device.cuda and not grpo.use_vllm and not sharded
                )
                tr.grpo = grpo
        cp = dist.fsdp.context_parallel_size
        if cp > 1 and dist.strategy == Strategy.fsdp:
            if res.processes_per_node % cp:
                raise _field_error(
                    ("distributed", "fsdp", "context_parallel_size"),
                    f"context_parallel_size {cp} must divide processes_per_node {res.processes_per_node} "
                    "(a sequence is split over the GPUs of one node)",
                )
            if tr.method == "grpo":
                raise _field_error(
                    ("distributed", "fsdp", "context_parallel_size"),
                    "GRPO builds its inputs after generation and TRL cannot split them: "
                    "context_parallel_size 1",
                )
        method, fmt = str(tr.method), str(self.dataset.format)
        if fmt != "auto" and fmt not in METHOD_FORMATS[method]:
            raise _field_error(
                ("dataset", "format"),
                f"training.method {method} trains on {' or '.join(METHOD_FORMATS[method])} data, not {fmt}",
            )
        if tr.loss_on != LossOn.all:
            needs = LOSS_ON_FORMATS[str(tr.loss_on)]
            if fmt != "auto" and fmt not in needs:
                raise _field_error(
                    ("training", "loss_on"),
                    f"loss_on {tr.loss_on} needs dataset.format {' or '.join(needs)}, not {fmt}",
                )
        if self.model.adapter is not None and self.lora is None:
            raise _field_error(
                ("model", "adapter"),
                "an adapter goes on training as LoRA: give `lora` as well (full fine-tuning starts from "
                "model.name_or_path; for a full model a job made, name its final/ folder there)",
            )
        if tr.dpo is not None and tr.dpo.sync_ref_model and self.lora is not None:
            raise _field_error(
                ("training", "dpo", "sync_ref_model"),
                "sync_ref_model needs full fine-tuning: with LoRA the reference is the base model with the "
                "adapter disabled, and there is no separate reference to update",
            )
        if tr.method == Method.grpo:
            self._check_grpo()
        if dist.strategy == Strategy.deepspeed and res.device == Device.cpu:
            for field in ("offload_optimizer", "offload_params"):
                if getattr(dist.deepspeed, field) == Offload.nvme:
                    raise _field_error(("distributed", "deepspeed", field), "nvme offload needs cuda")
        return self

    @property
    def display_name(self) -> str:
        return self.name or self.model.name_or_path.rstrip("/").split("/")[-1]


class SpecFieldError(ValueError):
    """A cross-field rule that names the field it is about (the 422 body carries this path)."""

    def __init__(self, loc: tuple[str | int, ...], message: str):
        super().__init__(message)
        self.loc = loc
        self.message = message


def _field_error(loc: tuple[str | int, ...], message: str) -> SpecFieldError:
    return SpecFieldError(loc, message)


def hub_models(spec: JobSpec) -> list[tuple[str, str | None]]:
    """(hub id, revision) of each hub model a run loads (`model.name_or_path`, `model.adapter`): what the
    fetch step (trainer.fetch) downloads before the ranks start; empty when every one is a local path."""
    found: list[tuple[str, str | None]] = []
    if not looks_local(spec.model.name_or_path):
        found.append((spec.model.name_or_path, spec.model.revision))
    if spec.model.adapter and not looks_local(spec.model.adapter):
        found.append((spec.model.adapter, None))
    return found


def hub_datasets(spec: JobSpec) -> list[tuple[str, str | None]]:
    """(hub id, revision) of the hub dataset a run loads (`dataset.name_or_path` that is not a local path),
    which the fetch step downloads too; the revision is None (the Hub's main): a dataset has no revision
    field. Empty for a local path or an uploaded file."""
    name = spec.dataset.name_or_path
    if name is None or looks_local(name):
        return []
    return [(name, None)]


def needs_fetch(spec: JobSpec) -> bool:
    """Whether a run has a fetch step: its spec names a hub model or a hub dataset."""
    return bool(hub_models(spec) or hub_datasets(spec))
