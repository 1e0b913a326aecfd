"""Preflight: will the job fit in device memory and in the nodes' host RAM, and how much disk will it write?

Everything is computed from the model's `config.json` alone (no weights, no torch), so a 180B job can be
checked on a laptop before it waits a day in a queue. The numbers are estimates of the usual accounting:

- weights, gradients and Adam state (full fine-tuning: 16 bytes per parameter in all; LoRA: the frozen
  base in the compute dtype plus 16 bytes per adapter parameter), divided by the world size where ZeRO
  or FSDP shards them, and dropped from the device where they are offloaded. Under ZeRO-3 these model
  states follow DeepSpeed's own formula (`estimate_zero3_model_states_mem_needs`: 18 bytes per
  parameter over the world, plus 4 bytes per parameter of the largest layer);
- activations for `max_seq_len x per_device_train_batch_size` tokens per layer (Korthikanti et al.,
  "Reducing Activation Recomputation in Large Transformer Models", with the MLP and attention shapes of
  the actual model), or with gradient checkpointing one hidden state per layer plus one layer's worth;
- the loss head as TRL's SFTTrainer computes it (see `_loss_head_bytes`), communication buffers
  (gathered layers under ZeRO-3 / FSDP, reduce buckets) and the CUDA context.

A job fits when that sum is within `USABLE_DEVICE_FRACTION` of the device memory (the rest is the
caching allocator's), and, where the operator says how much host RAM a node has, when the host estimate
per node fits it too: model loading (every rank's copy, or one per node with RAM-efficient loading),
the final gather of a full state dict on rank 0, and ZeRO / FSDP CPU offload.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftq.contract import runs
from ftq.contract.plans import DiskEstimate, Estimate, Parallelism
from ftq.contract.spec import JobSpec, LoraSpec, Offload, Strategy, looks_local, resolved_save_dtype
from ftq.runtime import userfiles

GiB = 1024**3
# The largest model config.json preflight reads (FTQ_MAX_CONFIG_BYTES); real ones are a few KiB.
CONFIG_MAX_BYTES = 1024**2
CUDA_CONTEXT_BYTES = int(1.5 * GiB)  # CUDA/NCCL context and cuBLAS workspaces
# PyTorch's caching allocator reserves more than it hands out (blocks rounded up, fragments too small
# to reuse), and a card sold as "80 GB" shows CUDA ~79.3 GiB: a job that needs 79.5 of 80 GiB dies of
# OOM after hours. The estimate must stay within this share of the device memory to fit; 5 % keeps the
# Llama 2 70B and Falcon 180B examples (both on 80 GB A100s) fitting while refusing what has no room left.
USABLE_DEVICE_FRACTION = 0.95
# Host RAM of one rank besides model state: Python, torch and CUDA libraries, pinned buffers, the data
# loader; measured at 1.5-3 GB for the trainer's processes.
HOST_RUNTIME_BYTES = 2 * GiB
# DeepSpeed's `additional_buffer_factor` for host memory in its ZeRO-3 estimate (its default).
DS_HOST_BUFFER_FACTOR = 1.5
# TRL's fused LM head (trl.kernels.chunked_logprob): tiles of this many tokens x this many vocab entries.
TRL_TOKEN_TILE = 4096
TRL_VOCAB_TILE = 32768
CPU_TILE_BYTES = 33
# Adam in mixed precision: fp32 master copy + two fp32 moments; in fp32: the two moments only.
ADAM_MASTER_AND_MOMENTS = 12
ADAM_MOMENTS = 8
# Bytes per weight of a full fine-tune's final/ by training.save_dtype (resolved).
SAVE_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


LLAMA_LIKE = {
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "olmo", "olmo2",
    "granite", "internlm2", "yi", "cohere", "stablelm", "starcoder2", "smollm3", "deepseek",
}  # fmt: skip


@dataclass(frozen=True)
class Linear:
    name: str
    d_in: int
    d_out: int


@dataclass(frozen=True)
class Arch:
    """The shapes that memory depends on, read from a config.json."""

    model_type: str
    hidden: int
    layers: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    gated_mlp: bool
    linears: tuple[Linear, ...]  # the Linear modules of one decoder layer
    layer_other_params: int  # norms and biases of one layer
    embedding_params: int  # token (and position) embeddings
    head_params: int  # untied lm_head; 0 when tied to the embeddings
    final_norm_params: int
    note: str | None = None

    @property
    def layer_params(self) -> int:
        return sum(lin.d_in * lin.d_out for lin in self.linears) + self.layer_other_params

    @property
    def largest_module_params(self) -> int:
        """The parameters of the largest single module (a Linear or the token embedding), the unit
        DeepSpeed's ZeRO-3 estimate calls the largest layer."""
        token_embedding = self.vocab * self.hidden
        return max(max(lin.d_in * lin.d_out for lin in self.linears), token_embedding)

    @property
    def num_params(self) -> int:
        return (
            self.layers * self.layer_params
            + self.embedding_params
            + self.head_params
            + self.final_norm_params
        )


def _get(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def parse_arch(config: dict[str, Any]) -> Arch | None:
    """The model's shapes, or None when the config is not a decoder this module knows how to count."""
    text_config = config.get("text_config")
    cfg: dict[str, Any] = text_config if isinstance(text_config, dict) else config
    model_type = str(cfg.get("model_type") or config.get("model_type") or "").lower()
    try:
        if model_type in ("falcon", "refinedweb", "refinedwebmodel"):
            return _falcon(cfg, model_type)
        if model_type == "gpt_neox":
            return _gpt_neox(cfg)
        if model_type == "gpt2":
            return _gpt2(cfg)
        if model_type in LLAMA_LIKE or all(
            k in cfg for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")
        ):
            arch = _llama_like(cfg, model_type or "unknown")
            if model_type not in LLAMA_LIKE:
                note = f"{model_type or 'unknown'} counted as a Llama-style decoder"
                return Arch(**{**arch.__dict__, "note": note})
            return arch
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return None


def _llama_like(cfg: dict[str, Any], model_type: str) -> Arch:
    h = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    kv = int(_get(cfg, "num_key_value_heads", default=heads))
    hd = int(_get(cfg, "head_dim", default=h // heads))
    inter = int(cfg["intermediate_size"])
    layers = int(cfg["num_hidden_layers"])
    vocab = int(cfg["vocab_size"])
    q, kvd = heads * hd, kv * hd
    linears = (
        Linear("q_proj", h, q), Linear("k_proj", h, kvd), Linear("v_proj", h, kvd), Linear("o_proj", q, h),
        Linear("gate_proj", h, inter), Linear("up_proj", h, inter), Linear("down_proj", inter, h),
    )  # fmt: skip
    qkv_bias = model_type == "qwen2" or bool(cfg.get("attention_bias"))
    other = 2 * h + ((q + 2 * kvd) if qkv_bias else 0) + (2 * hd if model_type == "qwen3" else 0)
    tied = bool(cfg.get("tie_word_embeddings", False))
    return Arch(
        model_type=model_type, hidden=h, layers=layers, vocab=vocab, heads=heads, kv_heads=kv, head_dim=hd,
        intermediate=inter, gated_mlp=True, linears=linears, layer_other_params=other,
        embedding_params=vocab * h, head_params=0 if tied else vocab * h, final_norm_params=h,
    )  # fmt: skip


def _falcon(cfg: dict[str, Any], model_type: str) -> Arch:
    h = int(_get(cfg, "hidden_size", "d_model"))
    heads = int(_get(cfg, "num_attention_heads", "n_head"))
    layers = int(_get(cfg, "num_hidden_layers", "n_layer"))
    vocab = int(cfg["vocab_size"])
    hd = h // heads
    new_arch = bool(cfg.get("new_decoder_architecture", False))
    multi_query = bool(cfg.get("multi_query", True))
    if new_arch:
        kv = int(_get(cfg, "num_kv_heads", "n_head_kv", default=heads))
    else:
        kv = 1 if multi_query else heads
    qkv_out = (heads + 2 * kv) * hd
    ffn = int(_get(cfg, "ffn_hidden_size", default=4 * h))
    bias = bool(cfg.get("bias", False))
    linears = (
        Linear("query_key_value", h, qkv_out), Linear("dense", h, h),
        Linear("dense_h_to_4h", h, ffn), Linear("dense_4h_to_h", ffn, h),
    )  # fmt: skip
    if new_arch:
        norms = int(_get(cfg, "num_ln_in_parallel_attn", default=2))
    else:
        norms = 1 if cfg.get("parallel_attn", True) else 2
    other = norms * 2 * h + ((qkv_out + h + ffn + h) if bias else 0)
    tied = bool(cfg.get("tie_word_embeddings", True))
    return Arch(
        model_type=model_type, hidden=h, layers=layers, vocab=vocab, heads=heads, kv_heads=kv, head_dim=hd,
        intermediate=ffn, gated_mlp=False, linears=linears, layer_other_params=other,
        embedding_params=vocab * h, head_params=0 if tied else vocab * h, final_norm_params=2 * h,
    )  # fmt: skip


def _gpt_neox(cfg: dict[str, Any]) -> Arch:
    h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    inter = int(_get(cfg, "intermediate_size", default=4 * h))
    linears = (
        Linear("query_key_value", h, 3 * h), Linear("dense", h, h),
        Linear("dense_h_to_4h", h, inter), Linear("dense_4h_to_h", inter, h),
    )  # fmt: skip
    vocab = int(cfg["vocab_size"])
    tied = bool(cfg.get("tie_word_embeddings", False))
    return Arch(
        model_type="gpt_neox", hidden=h, layers=int(cfg["num_hidden_layers"]), vocab=vocab, heads=heads,
        kv_heads=heads, head_dim=h // heads, intermediate=inter, gated_mlp=False, linears=linears,
        layer_other_params=4 * h + (3 * h + h + inter + h), embedding_params=vocab * h,
        head_params=0 if tied else vocab * h, final_norm_params=2 * h,
    )  # fmt: skip


def _gpt2(cfg: dict[str, Any]) -> Arch:
    h, heads = int(cfg["n_embd"]), int(cfg["n_head"])
    inter = int(_get(cfg, "n_inner", default=4 * h))
    linears = (
        Linear("c_attn", h, 3 * h), Linear("c_proj", h, h),
        Linear("c_fc", h, inter), Linear("c_proj", inter, h),
    )  # fmt: skip
    vocab, positions = int(cfg["vocab_size"]), int(_get(cfg, "n_positions", default=1024))
    return Arch(
        model_type="gpt2", hidden=h, layers=int(cfg["n_layer"]), vocab=vocab, heads=heads, kv_heads=heads,
        head_dim=h // heads, intermediate=inter, gated_mlp=False, linears=linears,
        layer_other_params=4 * h + (3 * h + h + inter + h), embedding_params=(vocab + positions) * h,
        head_params=0, final_norm_params=2 * h,
    )  # fmt: skip


def lora_targets(arch: Arch, lora: LoraSpec) -> list[Linear]:
    """The Linear modules of one layer that LoRA adapts (`all-linear`: all of them, not the lm_head)."""
    if lora.target_modules == "all-linear":
        return list(arch.linears)
    wanted = list(lora.target_modules)
    return [lin for lin in arch.linears if any(t == lin.name or t.endswith("." + lin.name) for t in wanted)]


def lora_params(arch: Arch, lora: LoraSpec) -> int:
    return arch.layers * sum(lora.r * (lin.d_in + lin.d_out) for lin in lora_targets(arch, lora))


# Memory ---------------------------------------------------------------------------------------------------


def _compute_bytes(spec: JobSpec) -> int:
    return 2 if spec.training.mixed_precision in ("bf16", "fp16") else 4


def _activation_bytes(spec: JobSpec, arch: Arch, cp: int = 1) -> dict[str, int]:
    """Bytes of activations kept for the backward pass, per device. DPO and reward models run each
    pair's chosen and rejected sequences in one batch: twice the sequences of the batch size. Context
    parallelism gives each GPU 1/cp of every sequence's tokens."""
    tr = spec.training
    pairs = 2 if tr.method in ("dpo", "reward") else 1
    tokens = math.ceil(tr.max_seq_len / cp) * tr.per_device_train_batch_size * pairs
    scale = _compute_bytes(spec) / 2  # the per-token figures below are for 16-bit activations
    h, q_dim, kv_dim = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    # Attention: qkv input, q, k, v, attention output (the o_proj input).
    attn = 2 * h + 2 * (q_dim + 2 * kv_dim) + 2 * q_dim
    if spec.model.attn_implementation == "eager":
        # Scores, softmax output and dropout mask: 5 bytes per head per key (Korthikanti's 5as/h term).
        attn += 5 * arch.heads * tr.max_seq_len
    # MLP: gated (SwiGLU) keeps gate, up, act(gate) and their product; plain keeps fc1 and act outputs.
    mlp = 2 * h + (8 * arch.intermediate if arch.gated_mlp else 4 * arch.intermediate)
    norms = 4 * h
    lora_extra = 0
    if spec.lora is not None:
        # Each adapted Linear keeps its (dropped-out) input and the rank-r intermediate.
        dropout_copy = 2 if spec.lora.dropout > 0 else 0
        lora_extra = sum(dropout_copy * lin.d_in + 2 * spec.lora.r for lin in lora_targets(arch, spec.lora))
    per_layer = int((attn + mlp + norms + lora_extra) * tokens * scale)
    checkpointing = tr.gradient_checkpointing or (
        spec.distributed.strategy == "fsdp" and spec.distributed.fsdp.activation_checkpointing
    )
    if checkpointing:
        # Each layer's input is kept; one layer at a time is recomputed in full during backward.
        activations = arch.layers * int(2 * h * tokens * scale) + per_layer
    else:
        activations = arch.layers * per_layer
    return {"activations": activations, "logits": _loss_head_bytes(spec, arch, tokens)}


def _loss_head_bytes(spec: JobSpec, arch: Arch, tokens: int) -> int:
    """The LM head and loss as TRL 1.x's SFTTrainer runs them: never the (batch, seq, vocab) logits.

    SFTTrainer patches the model with `add_fused_lm_head` and computes the loss from per-token
    log-probabilities (trl.kernels.chunked_logprob): forward and backward project
    `TRL_TOKEN_TILE x TRL_VOCAB_TILE` tiles in the compute dtype (float32 copies where Triton is missing),
    keep the final hidden states for backward, accumulate the hidden states' gradient in float32 and,
    when the head is trained (full fine-tuning), the whole head's gradient in float32 before casting it
    to the weight's dtype. transformers' own loss (`ForCausalLMLoss`) would instead hold the logits in
    the compute dtype, their float32 upcast and its gradient: 10 bytes per token and vocab entry, which
    for a 128k vocabulary at 4,096 tokens is 5 GB that this trainer never allocates.
    """
    cb = _compute_bytes(spec)
    tile = min(tokens, TRL_TOKEN_TILE) * min(arch.vocab, TRL_VOCAB_TILE)
    # With Triton (CUDA) a tile is folded in-kernel: the projection buffer alone. Without it TRL folds
    # with torch ops on float32 copies: measured 33 bytes per tile entry at the peak of a CPU step
    # (tests/integration/ftq/test_loss_head_memory.py).
    tile_bytes = tile * (CPU_TILE_BYTES if spec.resources.device == "cpu" else cb)
    hidden_saved = tokens * arch.hidden * cb
    hidden_grad = tokens * arch.hidden * 4
    head_grad = 0
    if spec.lora is None:
        # The gathered head's weight is in the compute dtype under FSDP / DeepSpeed, float32 elsewhere.
        weight_bytes = cb if str(spec.distributed.strategy) in ("fsdp", "deepspeed") else 4
        head_grad = arch.vocab * arch.hidden * (4 + weight_bytes)
    return int(tile_bytes + hidden_saved + hidden_grad + head_grad)


def estimate_memory(
    spec: JobSpec,
    model_config: dict[str, Any] | None,
    *,
    device_memory_bytes: int,
    host_memory_bytes: int | None = None,
) -> Estimate:
    """Peak memory per device and host RAM per node for this job: per_device_bytes, fits, breakdowns."""
    arch = parse_arch(model_config) if model_config else None
    if arch is None:
        kind = (model_config or {}).get("model_type", "unknown")
        reason = (
            f"model type {kind!r} is not one the estimate can count" if model_config else "no model config"
        )
        return Estimate(device_memory_bytes=device_memory_bytes, reason=f"{reason}; estimate skipped")
    usable = int(device_memory_bytes * USABLE_DEVICE_FRACTION)
    job = _decide(_Job.of(spec, arch), usable, device_memory_bytes)
    breakdown, host = _breakdowns(job, device_memory_bytes)
    per_device = sum(breakdown.values())
    host_bytes = host["runtime"] + max(host["loading"], host["offload"] + host["final_gather"])
    host_fits = None if not host_memory_bytes else host_bytes <= host_memory_bytes
    return Estimate(
        per_device_bytes=per_device,
        device_memory_bytes=device_memory_bytes,
        usable_device_bytes=usable,
        fits=per_device <= usable and host_fits is not False,
        breakdown=breakdown,
        host_bytes_per_node=host_bytes,
        host_breakdown=host,
        host_memory_bytes=host_memory_bytes or None,
        host_fits=host_fits,
        model_type=arch.model_type,
        num_parameters=job.total,
        trainable_parameters=job.trainable,
        world_size=job.world,
        note=arch.note or None,
        parallelism=_parallelism(job),
        kv_cache_bytes_per_token=2 * arch.layers * arch.kv_heads * arch.head_dim * job.cb,
        attention_width=arch.layers * arch.heads * arch.head_dim,
        quantized_parameters=_quantized_params(job) or None,
    )


def _breakdowns(job: _Job, device_memory_bytes: int) -> tuple[dict[str, int], dict[str, int]]:
    """The device breakdown (its sum is per_device_bytes) and the host breakdown of one decided job."""
    states, host_offload = _placed(job, _model_states(job))
    breakdown = _device_breakdown(job, states, device_memory_bytes)
    host = _host_breakdown(job.spec, job.arch, sum(breakdown.values()), job.trainable, host_offload)
    return breakdown, host


def _decide(job: _Job, usable: int, device_memory_bytes: int) -> _Job:
    """The estimate decides how a multi-node sharded job uses its nodes. Sharding over every GPU makes
    each micro-batch all-gather the whole model through the nodes' network (Llama 3.1 70B LoRA on 2 x 8:
    about 5.5 s of gathers per GPU against 2.5 s of compute); when one node's GPUs can hold the model
    states, shard within the node and replicate across nodes (HSDP, or ZeRO++ hpZ's secondary copy
    under ZeRO-3): the gathers stay on NVLink and only gradients cross the network. When they cannot
    (a 70B full fine-tune: about 1.1 TB of state), shard over every GPU. An explicit spec wins."""
    spec = job.spec
    res, dist = spec.resources, spec.distributed
    if res.num_nodes <= 1 or res.device != "cuda":
        return job
    ppn = res.processes_per_node
    if job.strategy == "fsdp" and ppn > 1 and not dist.fsdp.offload_params:
        wanted = dist.fsdp.hybrid_shard
        if wanted is False:
            return job
        hybrid = dataclasses.replace(job, shard=ppn // job.cp, hybrid_reason="")
        if wanted is True or sum(_breakdowns(hybrid, device_memory_bytes)[0].values()) <= usable:
            why = "set in the spec" if wanted else "one node's shard fits"
            return dataclasses.replace(hybrid, hybrid_reason=why)
        return dataclasses.replace(job, hybrid_reason="one node's shard would not fit: sharded over all GPUs")
    if job.zero3 and ppn > 1 and dist.deepspeed.offload_params == "none":
        wanted_hpz = dist.deepspeed.hpz_partition_size
        if wanted_hpz is not None:
            return dataclasses.replace(
                job, hpz=wanted_hpz if wanted_hpz > 1 else 0, hybrid_reason="set in the spec"
            )
        hpz = dataclasses.replace(job, hpz=ppn)
        if sum(_breakdowns(hpz, device_memory_bytes)[0].values()) <= usable:
            return dataclasses.replace(hpz, hybrid_reason="the node's secondary copy fits")
        return dataclasses.replace(job, hybrid_reason="the node's secondary copy would not fit: no hpZ")
    return job


def _parallelism(job: _Job) -> Parallelism | None:
    """What the decided job tells the render: None for a job that is not sharded."""
    spec = job.spec
    if job.strategy == "fsdp":
        replicate = job.world // (job.shard * job.cp)
        if replicate > 1:
            why = f"HSDP: sharded over the {job.shard} GPUs of each node, replicated over {replicate} nodes"
        else:
            why = f"sharded over all {job.shard} GPUs"
        if job.hybrid_reason:
            why += f" ({job.hybrid_reason})"
        if job.cp > 1:
            why += f"; each sequence split over {job.cp} GPUs (context parallelism)"
        return Parallelism(
            dp_shard_size=job.shard,
            dp_replicate_size=replicate,
            cp_size=job.cp,
            sync_each_batch=fsdp_sync_each_batch(spec),
            why=why,
        )
    if job.zero3:
        why = f"ZeRO-3 over all {job.world} GPUs"
        if job.hpz:
            why += f", ZeRO++ hpZ: a 16-bit copy sharded over each node's {job.hpz} GPUs for the gathers"
        if job.hybrid_reason:
            why += f" ({job.hybrid_reason})"
        return Parallelism(dp_shard_size=job.world, zero_hpz_partition_size=job.hpz or None, why=why)
    return None


def fsdp_sync_each_batch(spec: JobSpec) -> bool:
    """Whether an FSDP job reduce-scatters its gradients at every micro-batch: the spec's choice, else on
    for full fine-tuning with gradient accumulation. Without it transformers runs the accumulation's
    micro-batches under `no_sync`, and FSDP2 then keeps full-size gradients on every GPU until the last
    one (14 GiB more per GPU for a 7B model in bf16; a 70B one runs out of memory). LoRA's gradients are
    small: skipping the syncs costs little memory and saves the collectives."""
    explicit = spec.distributed.fsdp.sync_each_batch
    if explicit is not None:
        return explicit
    return spec.lora is None and spec.training.gradient_accumulation_steps > 1


@dataclass(frozen=True)
class _Job:
    """What each step of the memory estimate reads: the spec, its model's architecture, the world size,
    the compute dtype's bytes (`cb`) and the parameter counts."""

    spec: JobSpec
    arch: Arch
    world: int
    cb: int
    total: int
    trainable: int
    strategy: str
    zero3: bool
    # FSDP: the GPUs each weight is sharded over (the world, or a node's under HSDP) and the context
    # parallel group; ZeRO-3: the hpZ secondary partition's size (0: none). Decided by `_decide`.
    shard: int = 1
    cp: int = 1
    hpz: int = 0
    hybrid_reason: str = ""

    @classmethod
    def of(cls, spec: JobSpec, arch: Arch) -> _Job:
        res, dist = spec.resources, spec.distributed
        strategy = str(dist.strategy)
        world = res.num_nodes * res.processes_per_node
        cp = dist.fsdp.context_parallel_size if strategy == "fsdp" else 1
        return cls(
            shard=max(1, world // cp),
            cp=cp,
            spec=spec,
            arch=arch,
            world=res.num_nodes * res.processes_per_node,
            cb=_compute_bytes(spec),
            total=arch.num_params,
            trainable=arch.num_params if spec.lora is None else lora_params(arch, spec.lora),
            strategy=strategy,
            zero3=strategy == "deepspeed" and dist.deepspeed.zero_stage == 3,
        )


@dataclass(frozen=True)
class _States:
    """The model states on one device: weights, gradients and optimizer state (bytes)."""

    params: int
    grads: int
    optimizer: int


# QLoRA's 4-bit base weights (bitsandbytes): half a byte a weight, plus one fp32 scale per block of 64
# weights, or with double quantization an 8-bit one and an fp32 scale per 256 of those.
QLORA_WEIGHT_BYTES = 0.5
QLORA_SCALE_BYTES = 4 / 64
QLORA_DOUBLE_QUANT_SCALE_BYTES = 1 / 64 + 4 / (64 * 256)


def _frozen_base_bytes(job: _Job, base_bytes: int) -> float:
    """The frozen base's weights: `base_bytes` each, but under QLoRA the decoder layers' Linear weights
    in 4 bits (embeddings, the head and the norms stay in the compute dtype)."""
    quant = job.spec.lora.quantization if job.spec.lora is not None else None
    if quant is None:
        return float(job.total * base_bytes)
    linear = job.arch.layers * sum(lin.d_in * lin.d_out for lin in job.arch.linears)
    per = QLORA_WEIGHT_BYTES + (QLORA_DOUBLE_QUANT_SCALE_BYTES if quant.double_quant else QLORA_SCALE_BYTES)
    return linear * per + (job.total - linear) * job.cb


def _model_states(job: _Job) -> _States:
    """Weights, gradients and Adam state before sharding (ZeRO-3: DeepSpeed's own, already per device)."""
    spec, dist, cb, total, trainable = job.spec, job.spec.distributed, job.cb, job.total, job.trainable
    # Load dtypes as the trainer chooses them (trainer.model.load_dtype): full fine-tuning outside
    # DeepSpeed, and FSDP1, keep fp32 weights (the compute dtype comes from FSDP's policy or autocast);
    # DeepSpeed, LoRA elsewhere and FSDP2's LoRA (accelerate upcasts the adapter alone) load in the half
    # dtype.
    if job.zero3:
        # DeepSpeed's own arithmetic (deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs):
        # 18 bytes per parameter over the world (16-bit weight, and 16 bytes of gradient, fp32 master
        # and Adam moments), 2 of them when the optimizer is offloaded, none when the parameters are too.
        # Under LoRA only the adapters carry the 16; the frozen base keeps its 16-bit weight.
        state_bytes = 16 if cb == 2 else 12  # fp32 training has no master copy
        params = (
            0
            if dist.deepspeed.offload_params != "none"
            else int((_frozen_base_bytes(job, cb) + cb * _adapters(spec, job.arch)) / job.world)
        )
        states = 0 if dist.deepspeed.offload_optimizer != "none" else int(state_bytes * trainable / job.world)
        grads = states * cb // state_bytes
        return _States(params, grads, states - grads)
    if spec.lora is None:
        if job.strategy == "deepspeed" and cb == 2:
            # 16-bit weights and gradients; DeepSpeed's optimizer holds the fp32 master copy.
            p_bytes, g_bytes, o_bytes = cb, cb, ADAM_MASTER_AND_MOMENTS
        else:
            p_bytes, g_bytes, o_bytes = 4, 4, ADAM_MOMENTS
        return _States(total * p_bytes, trainable * g_bytes, trainable * o_bytes)
    # Frozen base weights in their load dtype (FSDP1: fp32, its flat parameters hold one dtype; FSDP2
    # and the others: the compute dtype); adapters in fp32 (PEFT keeps them so, accelerate's FSDP2 path
    # upcasts them) with fp32 grads and Adam moments.
    base = int(_frozen_base_bytes(job, _load_bytes(spec)))
    return _States(base + trainable * 4, trainable * 4, trainable * ADAM_MOMENTS)


def _placed(job: _Job, states: _States) -> tuple[_States, int]:
    """The model states left on one device once ZeRO-1/2 or FSDP shards them and what is offloaded is
    taken off, and the host RAM per node that FSDP's CPU offload holds instead."""
    dist = job.spec.distributed
    params, grads, optimizer = states.params, states.grads, states.optimizer
    if job.strategy == "deepspeed" and not job.zero3:
        stage = dist.deepspeed.zero_stage
        if stage >= 2:
            grads //= job.world
        if stage >= 1:
            optimizer //= job.world
        if dist.deepspeed.offload_optimizer != "none":
            optimizer = 0
    elif job.strategy == "fsdp":
        # Sharded over the shard group: every GPU (FSDP), a node's (HSDP); a context-parallel group
        # holds the same shard on each of its GPUs.
        params, grads, optimizer = params // job.shard, grads // job.shard, optimizer // job.shard
        if job.spec.training.gradient_accumulation_steps > 1 and not fsdp_sync_each_batch(job.spec):
            # Under no_sync FSDP2 keeps each parameter's full-size gradient, in the compute dtype, on every
            # GPU until the accumulation's last micro-batch reduce-scatters it.
            grads += job.trainable * job.cb
        if dist.fsdp.offload_params:
            # FSDP CPU offload keeps parameter shards and gradients on the host; the optimizer steps there.
            host_offload = (params + grads + optimizer) * job.spec.resources.processes_per_node
            return _States(0, 0, 0), host_offload
    return _States(params, grads, optimizer), 0


def _comm_bytes(job: _Job) -> int:
    """Communication buffers: the layers gathered at once under FSDP, DeepSpeed's buckets otherwise."""
    spec, arch, cb, dist = job.spec, job.arch, job.cb, job.spec.distributed
    if job.zero3:
        # The prefetch and reduce buckets that transformers sizes from the hidden size (0.9 h^2, h^2).
        return int(1.9 * arch.hidden * arch.hidden * cb)
    if job.strategy == "fsdp":
        # The layer being computed plus the one being prefetched, in the compute dtype, and the
        # unsharded gradients of one layer before they are reduce-scattered.
        largest_unit = max(arch.layer_params, arch.embedding_params + arch.head_params)
        trainable_layer = arch.layer_params if spec.lora is None else job.trainable // max(arch.layers, 1)
        comm = 2 * largest_unit * cb + trainable_layer * cb
        if not dist.fsdp.reshard_after_forward:
            # Without resharding after forward, every gathered layer stays until its backward.
            comm += job.total * cb
        return comm
    if job.strategy == "deepspeed" and dist.deepspeed.zero_stage in (1, 2):
        return 2 * arch.hidden * arch.hidden * cb + min(job.trainable, int(5e8)) * cb
    if job.strategy == "ddp" and job.world > 1:
        # DDP's gradient buckets are a second copy of the gradients.
        return job.trainable * (4 if spec.lora is not None or cb == 4 else cb)
    return 0


def _device_breakdown(job: _Job, states: _States, device_memory_bytes: int = 0) -> dict[str, int]:
    """Bytes per device by what holds them; their sum is the estimate's per_device_bytes."""
    spec = job.spec
    ref = _reference_bytes(spec, job.total, job.cb, job.shard if job.strategy == "fsdp" else job.world)
    hpz = 0
    if job.hpz:
        # ZeRO++ hpZ keeps a second copy of the 16-bit weights, sharded over the node's GPUs only.
        hpz = int((_frozen_base_bytes(job, job.cb) + job.cb * _adapters(spec, job.arch)) / job.hpz)
    out = {
        "params": int(states.params),
        **({"reference_model": ref} if ref else {}),
        **({"hpz_secondary_params": hpz} if hpz else {}),
        "grads": int(states.grads),
        "optimizer": int(states.optimizer),
        # DeepSpeed's term for the largest layer: its 16-bit weight and gradient, gathered whole.
        **({"largest_layer": 4 * job.arch.largest_module_params} if job.zero3 else {}),
        **_activation_bytes(spec, job.arch, job.cp),
        **_generation_bytes(spec, job.arch, job.cb, device_memory_bytes),
        "comm_buffers": int(_comm_bytes(job)),
        "cuda_context": CUDA_CONTEXT_BYTES if spec.resources.device == "cuda" else 0,
    }
    if job.zero3 and spec.lora is not None and spec.lora.quantization is not None:
        # bitsandbytes quantizes while from_pretrained loads, before ZeRO-3 can partition anything: every
        # GPU holds the whole 4-bit model (Llama 2 70B: about 38 GiB) at the start. The peak is the larger
        # of that and training's; what loading needs beyond training is counted here.
        at_load = int(_frozen_base_bytes(job, job.cb)) + out["cuda_context"]
        extra = at_load - sum(out.values())
        if extra > 0:
            out["quantized_load_peak"] = extra
    return out


def _quantized_params(job: _Job) -> int:
    """The weights QLoRA holds in 4 bits: the decoder layers' Linear weights; 0 without quantization."""
    if job.spec.lora is None or job.spec.lora.quantization is None:
        return 0
    return job.arch.layers * sum(lin.d_in * lin.d_out for lin in job.arch.linears)


def _generation_bytes(spec: JobSpec, arch: Arch, cb: int, device_memory_bytes: int = 0) -> dict[str, int]:
    """GRPO's generation, per device: the KV cache of the completions this process samples at once.

    Each process generates its share of a generation batch, per_device_train_batch_size x
    steps_per_generation sequences (each of its prompts num_generations times: TRL spreads a prompt's
    group over the batch), each up to max_seq_len + max_completion_length tokens (the trainer keeps a
    prompt's last max_seq_len tokens, and the completion comes on top): keys and values of every layer,
    in the compute dtype. With vLLM (TRL's
    colocate mode) vLLM reserves vllm_gpu_memory_utilization of each device for its own copy of the
    weights and its KV cache, whatever the training needs: that share is counted (`vllm_reserved`).
    Empty for the other methods."""
    tr = spec.training
    if tr.method != "grpo":
        return {}
    grpo: Any = tr.method_parameters()
    if grpo.use_vllm:
        return {"vllm_reserved": int(grpo.vllm_gpu_memory_utilization * device_memory_bytes)}
    sequences = tr.per_device_train_batch_size * grpo.steps_per_generation_or(tr.gradient_accumulation_steps)
    seq = tr.max_seq_len + grpo.max_completion_length
    kv = 2 * arch.layers * arch.kv_heads * arch.head_dim * seq * sequences * cb
    # The sampling step's logits: one row of the vocabulary per sequence, in float32.
    logits = sequences * arch.vocab * 4
    return {"generation_kv_cache": int(kv + logits)}


def _reference_bytes(spec: JobSpec, total: int, cb: int, world: int) -> int:
    """The frozen reference model of full fine-tuning DPO/KTO (and GRPO with beta > 0; GRPO with beta 0
    loads none), per device: weights only (no gradients,
    no optimizer state), in the policy's load dtype, which TRL gives it. ZeRO-3 partitions it like the
    policy (TRL's prepare_deepspeed), FSDP shards it (prepare_fsdp); DDP and ZeRO-1/2 hold a whole copy
    on every device. None with LoRA (the base with the adapter disabled is the reference) or with
    precomputed reference log-probabilities (the reference is gone before training starts)."""
    tr = spec.training
    if tr.method not in ("dpo", "kto", "grpo") or spec.lora is not None:
        return 0
    params = tr.method_parameters()
    if tr.method == "grpo" and getattr(params, "beta", 0) == 0:
        return 0
    if params is not None and getattr(params, "precompute_ref_log_probs", False):
        return 0
    dist = spec.distributed
    strategy = str(dist.strategy)
    if strategy == "deepspeed" and dist.deepspeed.zero_stage == 3:
        return 0 if dist.deepspeed.offload_params != "none" else total * cb // world
    if strategy == "fsdp":
        return 0 if dist.fsdp.offload_params else total * 4 // world
    return total * _load_bytes(spec)


def _adapters(spec: JobSpec, arch: Arch) -> int:
    return 0 if spec.lora is None else lora_params(arch, spec.lora)


def _load_bytes(spec: JobSpec) -> int:
    """Bytes per parameter of the weights as from_pretrained returns them (trainer.model.load_dtype): the
    half dtype under DeepSpeed, for LoRA, and for FSDP2's LoRA (its frozen base: Llama-3.1-70B is 16.5 GiB a
    GPU on 8, and 131 GiB of rank 0's host RAM with RAM-efficient loading, not 33 and 263); float32 for
    full fine-tuning elsewhere, for FSDP1 and without mixed precision."""
    strategy = str(spec.distributed.strategy)
    if _compute_bytes(spec) == 4:
        return 4
    if strategy == "fsdp":
        return 2 if spec.distributed.fsdp.version == 2 and spec.lora is not None else 4
    return 2 if strategy == "deepspeed" or spec.lora is not None else 4


def _host_breakdown(
    spec: JobSpec, arch: Arch, per_device: int, trainable: int, fsdp_offload: int
) -> dict[str, int]:
    """Host RAM per node, by what holds it. Loading comes first and is freed once the weights are on
    the devices; offloaded state stays for the whole run, and the final gather comes on top of it."""
    res, dist = spec.resources, spec.distributed
    procs, nodes = res.processes_per_node, res.num_nodes
    total = arch.num_params
    strategy = str(dist.strategy)
    runtime = HOST_RUNTIME_BYTES * procs
    if res.device == "cpu":
        # The "device" is the host: every process's whole estimate lives in this node's RAM.
        return {"runtime": runtime, "loading": per_device * procs, "offload": 0, "final_gather": 0}
    zero3 = strategy == "deepspeed" and dist.deepspeed.zero_stage == 3
    load = _load_bytes(spec)
    if zero3:
        # DeepSpeed's host terms (estimate_zero3_model_states_mem_needs, buffer factor 1.5): with
        # zero3_init every rank builds its shard and reads the checkpoint a layer at a time; without
        # it every rank holds the full fp32 model first.
        per_rank = arch.largest_module_params if dist.deepspeed.zero3_init else total
        loading = int(per_rank * 4 * procs * DS_HOST_BUFFER_FACTOR)
    elif strategy == "fsdp" and dist.fsdp.cpu_ram_efficient_loading:
        # Local rank 0 reads the weights; the others build on `meta` and receive them when FSDP wraps.
        loading = total * load
    elif load == 2:
        # 16-bit weights loaded as they are stored: from_pretrained maps the safetensors files and the
        # tensors share the kernel's page cache, one copy per node however many ranks read it (DDP and
        # ZeRO-1/2 with LoRA or in bf16: Llama 2 70B is 138 GB per node, not 8 x 138 on a 1 TB node);
        # each rank holds one module of its own in flight.
        loading = total * load + arch.largest_module_params * load * procs
    else:
        # fp32 from a 16-bit checkpoint: every rank converts into memory of its own.
        loading = total * load * procs
    if not zero3 and _reference_bytes(spec, total, 4, 1):
        # Full fine-tuning DPO/KTO: TRL reads the reference's weights on every rank before the launch
        # shards it (ZeRO-3 init partitions it while it loads).
        loading += total * load * procs
    offload = fsdp_offload
    if strategy == "deepspeed" and dist.deepspeed.zero_stage > 0:
        ds = dist.deepspeed
        # DeepSpeed's arithmetic for what it offloads, per node: 16 bytes per trainable parameter for the
        # optimizer (its fp32 gradient, master copy and Adam moments) and 2 per parameter for the weights.
        offloaded = (16 * trainable if ds.offload_optimizer == "cpu" else 0) + (
            2 * (total + _adapters(spec, arch)) if ds.offload_params == "cpu" else 0
        )
        offload = int(offloaded / nodes * DS_HOST_BUFFER_FACTOR)
    # final/: rank 0 gathers a full state dict in its CPU memory (LoRA: the adapter alone).
    if strategy == "fsdp":
        final = trainable * 4
    elif zero3:
        final = (trainable if spec.lora is not None else total) * 2
    else:
        final = 0  # rank 0 saves the model it holds
    return {"runtime": runtime, "loading": int(loading), "offload": offload, "final_gather": int(final)}


@dataclass(frozen=True)
class Need:
    """What a candidate change needs: bytes per device and host RAM per node."""

    device: int
    host: int


Fits = Callable[[JobSpec], Need | None]


def _fitter(model_config: dict[str, Any], device_memory_bytes: int, host_memory_bytes: int | None) -> Fits:
    def fits(candidate: JobSpec) -> Need | None:
        est = estimate_memory(
            candidate,
            model_config,
            device_memory_bytes=device_memory_bytes,
            host_memory_bytes=host_memory_bytes,
        )
        if not est.fits:
            return None
        return Need(int(est.per_device_bytes or 0), int(est.host_bytes_per_node or 0))

    return fits


def _sentence(labels: list[str], need: Need) -> str:
    # The host figure too: CPU offload moves the state into the nodes' RAM, which must hold it.
    return (
        f"it would fit with {_join(labels)} (about {need.device / GiB:.1f} GiB per device and "
        f"{need.host / GiB:.0f} GiB of host RAM per node)"
    )


def suggest_fix(
    spec: JobSpec,
    model_config: dict[str, Any] | None,
    device_memory_bytes: int,
    host_memory_bytes: int | None = None,
) -> str | None:
    """One sentence: the smallest change that makes the job fit, or None (it fits, or nothing found).

    Only changes that keep what the job trains (the same weights, data and global batch): single changes
    first, cheapest first: gradient checkpointing, a smaller micro-batch, ZeRO-3/FSDP, more nodes (SLURM
    jobs with a sharded strategy), CPU offload; then the same changes combined. LoRA instead of full
    fine-tuning trains something else: `suggest_alternatives` offers it, labelled so.
    """
    if not model_config or parse_arch(model_config) is None:
        return None
    fits = _fitter(model_config, device_memory_bytes, host_memory_bytes)
    if fits(spec) is not None:
        return None
    found = _search(spec, _fix_steps(spec), fits)
    return _sentence(*found) if found else None


def suggest_alternatives(
    spec: JobSpec,
    model_config: dict[str, Any] | None,
    device_memory_bytes: int,
    host_memory_bytes: int | None = None,
) -> list[str]:
    """Changes that would make a job fit but change what it trains, each a sentence that says so."""
    if spec.lora is not None or not model_config or parse_arch(model_config) is None:
        return []
    fits = _fitter(model_config, device_memory_bytes, host_memory_bytes)
    if fits(spec) is not None:
        return []
    with_lora = spec.model_copy(deep=True)
    with_lora.lora = LoraSpec(r=16, alpha=32, dropout=0.05, target_modules="all-linear")
    label = "LoRA instead of full fine-tuning (lora: {r: 16, target_modules: all-linear})"
    if (need := fits(with_lora)) is not None:
        found: tuple[list[str], Need] | None = ([label], need)
    else:
        found = _search(with_lora, _fix_steps(with_lora), fits)
        if found is not None:
            found = ([label, *found[0]], found[1])
    if found is None:
        return []
    return [
        "Alternatively (changes what is trained: the base stays frozen and only adapters learn): "
        + _sentence(*found)
    ]


def _search(
    spec: JobSpec, steps: list[tuple[str, Callable[[JobSpec], None]]], fits: Fits
) -> tuple[list[str], Need] | None:
    *cheap, offload = steps
    for label, apply in cheap:
        candidate = spec.model_copy(deep=True)
        apply(candidate)
        if (need := fits(candidate)) is not None:
            return [label], need
    if (more := _more_nodes(spec, fits)) is not None:
        return [more[0]], more[1]
    candidate = spec.model_copy(deep=True)
    offload[1](candidate)
    if (need := fits(candidate)) is not None:
        return [offload[0]], need
    # Combined, in the same order.
    combined = spec.model_copy(deep=True)
    labels: list[str] = []
    for label, apply in cheap:
        apply(combined)
        labels.append(label)
        if (need := fits(combined)) is not None:
            return labels, need
    if (more := _more_nodes(combined, fits)) is not None:
        return [*labels, more[0]], more[1]
    offload[1](combined)
    if (need := fits(combined)) is not None:
        return [*labels, offload[0]], need
    return None


def _more_nodes(spec: JobSpec, fits: Fits) -> tuple[str, Need] | None:
    """Doubling the nodes of a sharded SLURM job until it fits (a local job cannot have more nodes).

    The global batch is kept by dividing gradient_accumulation_steps where it divides; where it cannot,
    the label says how the global batch grows, since that changes the run."""
    dist = spec.distributed
    sharded = dist.strategy == "fsdp" or (dist.strategy == "deepspeed" and dist.deepspeed.zero_stage == 3)
    if spec.resources.launcher != "slurm" or not sharded:
        return None
    tr, nodes = spec.training, spec.resources.num_nodes
    candidate = spec.model_copy(deep=True)
    while candidate.resources.num_nodes * 2 <= 1024:
        candidate.resources.num_nodes *= 2
        factor = candidate.resources.num_nodes // nodes
        accum = tr.gradient_accumulation_steps
        candidate.training.gradient_accumulation_steps = accum // factor if accum % factor == 0 else accum
        if (need := fits(candidate)) is not None:
            label = f"resources.num_nodes: {candidate.resources.num_nodes}"
            if accum % factor == 0:
                label += (
                    f" and training.gradient_accumulation_steps: {accum // factor} (the same global batch)"
                )
            else:
                per_node = spec.resources.processes_per_node * tr.per_device_train_batch_size * accum
                label += (
                    f" (the global batch grows from {per_node * nodes} to "
                    f"{per_node * candidate.resources.num_nodes} sequences per step)"
                )
            return label, need
    return None


def _join(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def _fix_steps(spec: JobSpec) -> list[tuple[str, Callable[[JobSpec], None]]]:
    steps: list[tuple[str, Callable[[JobSpec], None]]] = []
    tr, dist, res = spec.training, spec.distributed, spec.resources
    world = res.num_nodes * res.processes_per_node
    fsdp_ac = dist.strategy == "fsdp" and dist.fsdp.activation_checkpointing
    # Host RAM first: loading the weights once per node instead of once per rank costs nothing.
    if dist.strategy == "fsdp" and not dist.fsdp.cpu_ram_efficient_loading:

        def ram_efficient(s: JobSpec) -> None:
            s.distributed.fsdp.cpu_ram_efficient_loading = True

        steps.append(("distributed.fsdp.cpu_ram_efficient_loading: true", ram_efficient))
    if dist.strategy == "deepspeed" and dist.deepspeed.zero_stage == 3 and not dist.deepspeed.zero3_init:

        def zero3_init(s: JobSpec) -> None:
            s.distributed.deepspeed.zero3_init = True

        steps.append(("distributed.deepspeed.zero3_init: true", zero3_init))
    if not tr.gradient_checkpointing and not fsdp_ac:

        def checkpointing(s: JobSpec) -> None:
            s.training.gradient_checkpointing = True

        steps.append(("training.gradient_checkpointing: true", checkpointing))
    if tr.per_device_train_batch_size > 1:
        accum = tr.gradient_accumulation_steps * tr.per_device_train_batch_size

        def micro_batch(s: JobSpec) -> None:
            s.training.per_device_train_batch_size = 1
            s.training.gradient_accumulation_steps = accum

        steps.append(
            (f"training.per_device_train_batch_size: 1 and gradient_accumulation_steps: {accum}", micro_batch)
        )
    if world > 1:
        if dist.strategy == "ddp":

            def to_fsdp(s: JobSpec) -> None:
                s.distributed.strategy = Strategy.fsdp

            steps.append(("distributed.strategy: fsdp", to_fsdp))
        elif dist.strategy == "deepspeed" and dist.deepspeed.zero_stage < 3:

            def to_zero3(s: JobSpec) -> None:
                s.distributed.deepspeed.zero_stage = 3

            steps.append(("distributed.deepspeed.zero_stage: 3", to_zero3))
        elif dist.strategy == "fsdp" and not dist.fsdp.reshard_after_forward:

            def reshard(s: JobSpec) -> None:
                s.distributed.fsdp.reshard_after_forward = True

            steps.append(("distributed.fsdp.reshard_after_forward: true", reshard))
    if dist.strategy == "fsdp":

        def fsdp_offload(s: JobSpec) -> None:
            s.distributed.fsdp.offload_params = True

        steps.append(("distributed.fsdp.offload_params: true", fsdp_offload))
    else:

        def ds_offload(s: JobSpec) -> None:
            s.distributed.strategy = Strategy.deepspeed
            ds = s.distributed.deepspeed
            ds.zero_stage = 3
            ds.offload_optimizer = Offload.cpu
            ds.offload_params = Offload.cpu

        label = "CPU offload (distributed: {strategy: deepspeed, deepspeed: {zero_stage: 3, "
        label += "offload_optimizer: cpu, offload_params: cpu}})"
        steps.append((label, ds_offload))
    return steps


# Disk -----------------------------------------------------------------------------------------------------


def estimate_disk(spec: JobSpec, model_config: dict[str, Any] | None) -> DiskEstimate:
    """Bytes the run writes: its checkpoints (at their peak count on disk) and final/."""
    arch = parse_arch(model_config) if model_config else None
    if arch is None:
        return DiskEstimate(reason="model config unknown; disk estimate skipped")
    tr, dist = spec.training, spec.distributed
    total = arch.num_params
    deepspeed = dist.strategy == "deepspeed"
    if spec.lora is not None:
        trainable = lora_params(arch, spec.lora)
        # The adapter in fp32 and its optimizer state (DeepSpeed also stores the fp32 master copy).
        per_checkpoint = trainable * (4 + (ADAM_MASTER_AND_MOMENTS + 2 if deepspeed else ADAM_MOMENTS))
        final = trainable * 4
    elif deepspeed:
        # 16-bit weights plus fp32 master and moments, in per-rank shards.
        per_checkpoint = total * (2 + ADAM_MASTER_AND_MOMENTS)
        final = total * SAVE_DTYPE_BYTES[resolved_save_dtype(tr.save_dtype, tr.mixed_precision)]
    else:
        # fp32 weights (sharded under FSDP) plus Adam moments; final/ in training.save_dtype.
        per_checkpoint = total * (4 + ADAM_MOMENTS)
        final = total * SAVE_DTYPE_BYTES[resolved_save_dtype(tr.save_dtype, tr.mixed_precision)]
    out = DiskEstimate(checkpoint_bytes=int(per_checkpoint), final_bytes=int(final))
    if not tr.save_steps:
        count: int | None = 0
    elif tr.max_steps is not None:
        # Every save_steps, and once more at the last step when it is not a multiple.
        count = math.ceil(tr.max_steps / tr.save_steps)
    else:
        count = None
    if count is None:
        out.total_bytes = (
            int(per_checkpoint) * (tr.save_total_limit + 1) + int(final) if tr.save_total_limit else None
        )
        out.reason = "training by epochs: the checkpoint count depends on the dataset size"
        return out
    # The trainer writes a new checkpoint before deleting the oldest beyond save_total_limit.
    on_disk = min(count, tr.save_total_limit + 1) if tr.save_total_limit else count
    out.num_checkpoints = count
    out.checkpoints_on_disk = on_disk
    out.checkpoints_total_bytes = int(per_checkpoint) * on_disk
    out.total_bytes = int(per_checkpoint) * on_disk + int(final)
    return out


# Model config ---------------------------------------------------------------------------------------------


def local_model_problem(name_or_path: str, max_config_bytes: int = CONFIG_MAX_BYTES) -> str | None:
    """Why a local model folder cannot be trained from (no config, no weights), or None when it can.

    Checked at POST, so a folder holding only a config.json fails in the request, not minutes later
    after the job waited in a queue and the trainer started. Nothing is read but a config.json that is
    a regular file of at most `max_config_bytes` (ftq.runtime.userfiles).
    """
    if not looks_local(name_or_path):
        return None
    path = Path(name_or_path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return f"{name_or_path} does not exist"
    if not stat.S_ISDIR(mode):
        kind = "a file" if stat.S_ISREG(mode) else userfiles.kind_of(mode)
        return f"{name_or_path} is not a model folder (it is {kind})"
    try:
        raw = userfiles.read_capped(path / "config.json", max_config_bytes)
    except userfiles.Missing:
        return f"model folder {name_or_path} has no config.json"
    except userfiles.NotReadable as exc:
        return f"config.json in {name_or_path} {exc}"
    try:
        if not isinstance(json.loads(raw), dict):
            raise ValueError("not an object")
    except ValueError:
        return f"config.json in {name_or_path} is not a JSON object"
    if not runs.has_weights(path):
        return (
            f"model folder {name_or_path} has no weights (expected model.safetensors, a sharded "
            "*.safetensors index or pytorch_model.bin); save the model there with save_pretrained"
        )
    return None


def load_model_config(
    name_or_path: str, revision: str | None = None, max_bytes: int = CONFIG_MAX_BYTES
) -> tuple[dict[str, Any] | None, str | None]:
    """(config, None), or (None, reason) when the config is not on this machine or cannot be read.

    Read as ftq.runtime.userfiles reads a user's file: a regular file only, without blocking, at most
    `max_bytes` of it.
    """
    path: Path | None
    # Only a name written as a path is read from disk (the service has already confined it to the
    # allowed roots); a hub id that happens to match a folder in the working directory is still a hub id.
    if looks_local(name_or_path):
        path = Path(name_or_path)
        if path.is_dir():
            path = path / "config.json"
        follow = False
    else:
        path = _cached_hub_config(name_or_path, revision)
        if path is None:
            return None, f"config for {name_or_path} is not on this machine; estimate skipped"
        # The hub cache's files are links into its blob store, and the operator's, not a user's.
        follow = True
    try:
        data = json.loads(userfiles.read_capped(path, max_bytes, follow_symlinks=follow))
    except userfiles.NotReadable as exc:
        return None, f"could not read {path}: it {exc}; estimate skipped"
    except ValueError as exc:
        return None, f"could not read {path}: {exc.__class__.__name__}; estimate skipped"
    if not isinstance(data, dict):
        return None, f"{path} is not a JSON object; estimate skipped"
    return data, None


def _cached_hub_config(repo_id: str, revision: str | None) -> Path | None:
    # Offline by construction: only the local Hugging Face cache is consulted, never the network.
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except Exception:
        return None
    return Path(found) if isinstance(found, str) else None
