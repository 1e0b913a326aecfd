"""What planning a spec returns: the plan (`GET /jobs/{id}/plan`, a dry run), its memory and disk
estimate, its time estimate and its dataset preflight. `ftq.planning` computes them; the API serves them
and the SDK parses them, so they live in the contract."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class TimeEstimate(BaseModel):
    seconds: float | None = Field(
        description="Expected training time in seconds; null when tokens or parameters are unknown "
        "(the assumptions say which)."
    )
    tokens: int | None = Field(description="Tokens the run trains on (all epochs, all processes).")
    assumptions: list[str] = Field(description="Every number the estimate rests on, and where it came from.")
    flops: float | None = Field(None, description="Training FLOPs: tokens x factor x parameters.")
    devices: int = Field(description="GPUs (cuda) or CPU processes the run uses.")
    device_hours: float | None = Field(None, description="seconds / 3600 x devices.")
    cost: float | None = Field(
        None, description="device_hours x the operator's FTQ_PRICE_PER_DEVICE_HOUR; null when none is set."
    )
    tokens_per_second_per_device: float | None = Field(
        None,
        description="The operator's measured throughput (FTQ_TOKENS_PER_SECOND_PER_DEVICE) where set: the "
        "seconds are then tokens / (this x devices) rather than FLOPs at an assumed utilisation.",
    )
    reason: str | None = Field(None, description="Why `seconds` is null, in one sentence; null otherwise.")
    communication_seconds: float | None = Field(
        None,
        description="Of `seconds`, the part spent in collectives not hidden behind compute: FSDP's and "
        "ZeRO-3's per-step all-gathers and reduce-scatters (DDP's all-reduce) over the interconnect "
        "(FTQ_INTRA_NODE_GBPS, FTQ_INTER_NODE_GBPS, FTQ_COMM_OVERLAP); null where not estimated.",
    )
    generation_seconds: float | None = Field(
        None,
        description="Of `seconds`, GRPO's generation: token steps, each reading the weights and the KV "
        "cache over the device's memory bandwidth (FTQ_GPU_MEMORY_GBPS), plus FSDP's per-step gathers; "
        "null for the other methods.",
    )


class TokenStats(BaseModel):
    min: int
    median: int
    p95: int
    max: int
    mean: float


class DatasetPreflight(BaseModel):
    """`plan.dataset`: what the dry run and the submit found in the job's training data."""

    source: str = Field(description="The dataset: the file id, or the resolved local path or hub id.")
    rows: int | None = Field(
        None, description="Rows of the training data (estimated when `rows_exact` is false)."
    )
    rows_exact: bool = False
    sampled: bool = Field(False, description="Only the first `sample_rows` rows were tokenized.")
    sample_rows: int = 0
    tokenizer: str | None = Field(None, description="Where the tokenizer came from; null when skipped.")
    skipped: str | None = Field(None, description="Why token statistics are missing, if they are.")
    tokens_per_sample: TokenStats | None = None
    max_seq_len: int
    truncated_samples: int | None = Field(
        None, description="Samples (of the whole data, extrapolated when sampled) longer than max_seq_len."
    )
    truncated_fraction: float | None = None
    total_tokens: int | None = Field(None, description="Tokens in the training data, before truncation.")
    train_tokens_per_epoch: int | None = Field(
        None, description="Tokens one epoch trains on: each sample cut at max_seq_len (what the time uses)."
    )
    effective_batch_size: int = Field(
        description="per_device_train_batch_size x gradient_accumulation_steps x processes."
    )
    steps_per_epoch: int | None = Field(
        None, description="Optimizer steps per epoch (sequences of max_seq_len when packing)."
    )
    epochs: float | None = Field(
        None, description="Epochs the run covers (from num_train_epochs or max_steps)."
    )
    run_tokens: int | None = Field(
        None,
        description="Tokens the whole run trains on: every epoch's, or max_steps' worth at the data's mean "
        "sequence length (null when the data could not be tokenized).",
    )
    time_estimate: TimeEstimate | None = Field(
        None, description="The plan's `time_estimate` (the same object), next to the numbers it rests on."
    )


class DiskEstimate(BaseModel):
    """Bytes the run writes where runs are stored; None where it cannot be known before the run."""

    checkpoint_bytes: int | None = None
    final_bytes: int | None = None
    num_checkpoints: int | None = None
    checkpoints_on_disk: int | None = None
    checkpoints_total_bytes: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    reason: str | None = None


class Parallelism(BaseModel):
    """How a sharded job's GPUs divide the work (accelerate's ParallelismConfig and DeepSpeed's ZeRO++)."""

    dp_shard_size: int = Field(description="GPUs each weight is sharded over (FSDP), or the world (ZeRO-3).")
    dp_replicate_size: int = Field(1, description="Replicas of the shards (HSDP: the nodes).")
    cp_size: int = Field(1, description="GPUs each sequence is split over (context parallelism).")
    zero_hpz_partition_size: int | None = Field(
        None, description="ZeRO++ hpZ: the secondary 16-bit weight partition's group (a node's GPUs)."
    )
    sync_each_batch: bool | None = Field(
        None, description="FSDP: gradients reduce-scattered at every micro-batch of gradient accumulation."
    )
    why: str = ""


class Estimate(BaseModel):
    """Preflight: memory per device, host RAM per node and the disk the run needs; None when skipped."""

    per_device_bytes: int | None = None
    device_memory_bytes: int | None = None
    fits: bool | None = Field(
        None,
        description="per_device_bytes within usable_device_bytes, and host_bytes_per_node within "
        "host_memory_bytes where that is known.",
    )
    breakdown: dict[str, int] = Field(default_factory=dict)
    usable_device_bytes: int | None = Field(
        None,
        description="The share of device_memory_bytes a job may plan for (95 %); the rest is left to the "
        "caching allocator.",
    )
    host_bytes_per_node: int | None = Field(
        None, description="Peak host RAM per node: runtime + max(loading, offload + final gather)."
    )
    host_breakdown: dict[str, int] = Field(
        default_factory=dict,
        description="runtime (every rank), loading (the copies of the weights read at start), offload "
        "(ZeRO / FSDP CPU offload), final_gather (the full state dict rank 0 gathers for final/).",
    )
    host_memory_bytes: int | None = Field(None, description="Host RAM per node, when the operator set it.")
    host_fits: bool | None = None
    fix: str | None = Field(
        None, description="The smallest change that makes the job fit without changing what it trains."
    )
    alternatives: list[str] = Field(
        default_factory=list,
        description="Changes that would fit but change what the job trains (e.g. LoRA instead of full "
        "fine-tuning); never applied or offered as the fix.",
    )
    reason: str | None = None
    model_type: str | None = None
    num_parameters: int | None = None
    trainable_parameters: int | None = None
    world_size: int | None = None
    note: str | None = None
    disk: DiskEstimate | None = None
    parallelism: Parallelism | None = Field(
        None, description="How the job's GPUs divide the work, as the estimate decided it (sharded jobs)."
    )
    kv_cache_bytes_per_token: int | None = Field(
        None, description="Keys and values of one token over all layers, in the compute dtype."
    )
    attention_width: int | None = Field(
        None, description="layers x heads x head_dim: what attention's FLOPs per token grow with."
    )
    quantized_parameters: int | None = Field(
        None, description="The 4-bit weights QLoRA dequantises at every pass (the decoder's Linear layers)."
    )


class Plan(BaseModel):
    """Everything rendered for one job; what `GET /jobs/{id}/plan` and a dry run return."""

    accelerate_config: dict[str, Any]
    accelerate_config_yaml: str
    command: list[str] = Field(
        description="The launch as argv: for a local job, the one `accelerate launch` on this host; for "
        "SLURM, what job.sbatch runs on every node under srun (`$SLURM_NODEID` and `$MASTER_ADDR` are "
        "each node's, set by SLURM and the script)."
    )
    sbatch_script: str | None
    trainer: str = Field(
        "trl.SFTTrainer",
        description="The TRL trainer the job runs, from training.method: trl.SFTTrainer, trl.DPOTrainer, "
        "trl.KTOTrainer or trl.RewardTrainer.",
    )
    trainer_args: dict[str, Any]
    estimate: Estimate | None = None
    time_estimate: TimeEstimate | None = Field(
        None,
        description="How long the training should take and what it costs, with every assumption stated "
        "(ftq/planning/timecost.py); in every plan rendered (null only in plans stored before it existed).",
    )
    dataset: DatasetPreflight | None = Field(
        None,
        description="The dataset preflight: rows, tokens per sample with the job's tokenizer, truncation at "
        "max_seq_len, total tokens, steps per epoch and the run's tokens (null for a plan rendered "
        "without it).",
    )
    launch_script: str
    warnings: list[str] = Field(
        default_factory=list,
        description="What submitting this spec would be refused for (a dry run answers with the plan "
        "anyway), each as `field.path: why and what to change`; empty when it would be accepted.",
    )
