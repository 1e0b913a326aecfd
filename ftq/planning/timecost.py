"""How long a job should take, and what it costs, before it runs (pure: spec, preflight numbers, settings).

    seconds = tokens / (devices x FTQ_TOKENS_PER_SECOND_PER_DEVICE)        where the operator measured it
    seconds = tokens x FLOPs per token per parameter x parameters / (devices x peak FLOP/s x utilisation)

One estimate per plan: `plan.time_estimate` (the scheduler's backfill reads its seconds), which
`plan.dataset.time_estimate` repeats.

- tokens: the dataset preflight's count where it tokenized the data (`run_tokens`: all epochs, or
  max_steps' worth at the sample's mean sequence length); else, with max_steps, max_steps x per-device
  batch x gradient accumulation x processes x max_seq_len (every sequence full length: with packing
  that is what trains; without it, shorter examples make it an upper bound).
- throughput: a measured FTQ_TOKENS_PER_SECOND_PER_DEVICE for this hardware beats any FLOPs arithmetic;
  without it, the FLOPs below at an assumed utilisation of the peak.
- FLOPs per token per parameter: 6 for full fine-tuning (forward 2, backward 4: the gradients of the
  activations and of the weights, 2 each). LoRA freezes the base weights, so the backward skips their
  weight gradients: 4 (the adapters' own few parameters are left out). Gradient checkpointing runs the
  forward again in the backward: +2.
- peak FLOP/s: FTQ_GPU_PEAK_TFLOPS[FTQ_GPU_TYPE] per GPU (dense bf16/fp16), FTQ_CPU_PEAK_GFLOPS per CPU
  process; utilisation: FTQ_ASSUMED_MFU (default 0.35, what well-tuned fine-tuning runs reach on A100/H100
  with FSDP or ZeRO; calibrate it from jobs' `estimate_vs_actual`).
- communication (cuda jobs over several GPUs, FLOPs estimate only: a measured throughput has it already):
  FSDP and ZeRO-3 all-gather the weights in the compute dtype for the forward and again for the backward
  (once with FSDP's reshard_after_forward off; gradient checkpointing's recompute reuses the backward's
  gather), then reduce-scatter the trainable parameters' gradients, every micro-batch; DDP and ZeRO-1/2
  all-reduce the gradients (twice their bytes). A ring collective moves (N-1)/N of the bytes through
  the slowest link: NVLink on one node (FTQ_INTRA_NODE_GBPS), the node's network across nodes
  (FTQ_INTER_NODE_GBPS). FTQ_COMM_OVERLAP of it hides behind compute (prefetching the next layer);
  the rest adds to the time.
- GRPO adds its generation: every step samples per-device batch x gradient accumulation x processes
  completions of up to max_completion_length tokens (all full length: an upper bound), each token one
  forward pass (2 FLOPs/token/parameter, with the KV cache); with beta > 0 the reference model's forward
  over the trained tokens (+2), and with num_iterations > 1 the old policy's log-probabilities (+2). With
  a measured throughput the generated tokens count as tokens.
- cost: seconds / 3600 x devices x FTQ_PRICE_PER_DEVICE_HOUR, where the operator set a price.
Model loading, evaluation and saving are not counted.
"""

from __future__ import annotations

import math
from typing import Any

from ftq.contract.plans import TimeEstimate
from ftq.contract.spec import JobSpec
from ftq.runtime.settings import Settings


def flops_factor(spec: JobSpec) -> tuple[int, str]:
    """FLOPs per token per parameter, and why."""
    if spec.lora is not None:
        factor, why = 4, "4 FLOPs/token/parameter (LoRA: forward 2 + activation gradients 2; the frozen "
        why += "weights get no weight gradients, the 2 that full fine-tuning's 6 adds)"
    else:
        factor, why = 6, "6 FLOPs/token/parameter (full fine-tuning: forward 2, backward 4)"
    if spec.training.gradient_checkpointing:
        factor += 2
        why += " + 2 for gradient checkpointing's second forward"
    return factor, why


def time_estimate(
    spec: JobSpec,
    settings: Settings,
    *,
    parameters: int | None,
    run_tokens: int | None = None,
    trainable: int | None = None,
) -> TimeEstimate:
    """The estimate for `spec`; `parameters` from the memory preflight, `run_tokens` (the whole run's)
    from the dataset preflight where it tokenized the data. `assumptions` says what each number rests on."""
    devices = spec.resources.world_size
    tokens, tokens_note = _tokens(spec, run_tokens)
    factor, factor_note = flops_factor(spec)
    notes = [tokens_note, factor_note]
    if parameters:
        notes.append(f"parameters: {parameters} (from the model's config)")
    else:
        notes.append("parameters unknown: the model's config could not be read")
    tps = settings.tokens_per_second_per_device or None
    if tps is not None:
        notes.append(
            f"throughput: {tps:g} tokens/s per device, measured on this hardware "
            "(FTQ_TOKENS_PER_SECOND_PER_DEVICE); the FLOPs below are for reference"
        )
    peak, peak_note = _peak_flops(spec, settings)
    notes.append(peak_note)
    if tps is None:
        notes.append(
            f"utilisation: {settings.assumed_mfu:g} of peak (FTQ_ASSUMED_MFU) on {devices} device(s)"
        )
    notes.append("not counted: model loading, evaluation, checkpoint and final saves, CPU offload traffic")

    flops = float(tokens) * factor * parameters if tokens is not None and parameters else None
    generated, gen_factor, gen_note = generation_terms(spec)
    if generated is not None and tokens is not None:
        notes.append(gen_note)
        if flops is not None and parameters:
            flops += (generated * 2 + tokens * gen_factor) * float(parameters)
        if tps is not None:
            tokens += generated
    seconds, reason = _seconds(spec, settings, tokens=tokens, parameters=parameters, flops=flops, peak=peak)
    comm = None
    if seconds is not None and tps is None and tokens is not None and parameters:
        comm, comm_note = communication_seconds(
            spec, settings, tokens=tokens, parameters=parameters, trainable=trainable
        )
        if comm_note:
            notes.append(comm_note)
        if comm:
            seconds += comm
    device_hours = seconds / 3600 * devices if seconds is not None else None
    cost = None
    if device_hours is not None and settings.price_per_device_hour is not None:
        cost = device_hours * settings.price_per_device_hour
        notes.append(f"cost: {settings.price_per_device_hour:g} per device hour (FTQ_PRICE_PER_DEVICE_HOUR)")
    return TimeEstimate(
        seconds=seconds,
        tokens=tokens,
        assumptions=notes,
        flops=flops,
        devices=devices,
        device_hours=device_hours,
        cost=cost,
        tokens_per_second_per_device=tps,
        reason=reason,
        communication_seconds=comm,
    )


def generation_terms(spec: JobSpec) -> tuple[int | None, int, str]:
    """GRPO's extra work: (completion tokens generated over the run, extra FLOPs per trained token per
    parameter for the reference and old-policy forwards, the sentence); (None, 0, "") for the other
    methods, or without max_steps."""
    tr = spec.training
    if tr.method != "grpo" or tr.max_steps is None:
        return None, 0, ""
    grpo: Any = tr.method_parameters()
    per_step = tr.per_device_train_batch_size * tr.gradient_accumulation_steps * spec.resources.world_size
    completions = tr.max_steps * per_step
    generated = completions * grpo.max_completion_length // grpo.num_iterations
    extra, why = 0, []
    if grpo.beta > 0:
        extra += 2
        why.append("+2 for the reference model's forward (beta > 0)")
    if grpo.num_iterations > 1:
        extra += 2
        why.append("+2 for the old policy's log-probabilities (num_iterations > 1)")
    note = (
        f"generation: {generated} completion tokens ({completions} completions of up to "
        f"max_completion_length {grpo.max_completion_length}, generated once per num_iterations "
        f"{grpo.num_iterations}), one forward each: 2 FLOPs/token/parameter"
    )
    if why:
        note += "; trained tokens " + ", ".join(why)
    return generated, extra, note


def _micro_steps(spec: JobSpec, tokens: int) -> int:
    """Forward-backward passes per rank: max_steps x gradient accumulation, else the tokens in full-length
    micro-batches."""
    tr = spec.training
    if tr.max_steps is not None:
        return tr.max_steps * tr.gradient_accumulation_steps
    per_pass = spec.resources.world_size * tr.per_device_train_batch_size * tr.max_seq_len
    return max(1, math.ceil(tokens / per_pass))


def communication_seconds(
    spec: JobSpec, settings: Settings, *, tokens: int, parameters: int, trainable: int | None
) -> tuple[float | None, str | None]:
    """The collectives' time not hidden behind compute, and the sentence that says how it was counted;
    (None, None) where there is no term (one device, a CPU job)."""
    res, dist, tr = spec.resources, spec.distributed, spec.training
    world = res.world_size
    if world <= 1 or res.device != "cuda" or str(dist.strategy) == "none":
        return None, None
    width = 4 if tr.mixed_precision == "no" else 2
    grads = trainable if trainable is not None else (parameters if spec.lora is None else 0)
    strategy = str(dist.strategy)
    sharded = strategy == "fsdp" or (strategy == "deepspeed" and dist.deepspeed.zero_stage == 3)
    if sharded:
        gathers = 2 if strategy == "deepspeed" or dist.fsdp.reshard_after_forward else 1
        per_pass = gathers * parameters * width + grads * width
        what = (
            f"{gathers} all-gather(s) of the {parameters} weights and a reduce-scatter of {grads} gradients, "
            f"{width} bytes each"
        )
    else:
        per_pass = 2 * grads * width
        what = f"an all-reduce of {grads} gradients ({width} bytes each, twice over a ring)"
    if res.num_nodes > 1:
        bandwidth, link = settings.inter_node_gbps, f"{settings.inter_node_gbps:g} GB/s between nodes"
        link += " (FTQ_INTER_NODE_GBPS)"
    else:
        bandwidth, link = settings.intra_node_gbps, f"{settings.intra_node_gbps:g} GB/s within the node"
        link += " (FTQ_INTRA_NODE_GBPS)"
    passes = _micro_steps(spec, tokens)
    total = passes * per_pass * (world - 1) / world / (bandwidth * 1e9)
    exposed = total * (1 - settings.comm_overlap)
    note = (
        f"communication: {what} per micro-batch, x{passes} micro-batches, (N-1)/N of it over {link}: "
        f"{total / 3600:.2f} h, of which {1 - settings.comm_overlap:g} not hidden behind compute "
        f"(FTQ_COMM_OVERLAP {settings.comm_overlap:g}): +{exposed / 3600:.2f} h"
    )
    return exposed, note


def _tokens(spec: JobSpec, run_tokens: int | None) -> tuple[int | None, str]:
    """The tokens the run trains on, and where the count comes from."""
    tr, devices = spec.training, spec.resources.world_size
    if tr.method == "grpo" and tr.max_steps is not None:
        # GRPO trains on prompts and the completions it samples, not on the rows' own lengths.
        run_tokens = None
    if run_tokens is not None:
        counted = (
            f"{tr.max_steps} steps at the data's mean sequence length"
            if tr.max_steps is not None
            else f"{tr.num_train_epochs or 1.0:g} epochs"
        )
        return run_tokens, f"tokens: the dataset preflight's count with the job's tokenizer ({counted})"
    if tr.max_steps is None:
        return None, "tokens unknown: num_train_epochs without a dataset token count"
    tokens = tr.max_steps * tr.per_device_train_batch_size * tr.gradient_accumulation_steps * devices
    tokens *= tr.max_seq_len
    return tokens, (
        f"tokens: max_steps {tr.max_steps} x batch {tr.per_device_train_batch_size} x gradient "
        f"accumulation {tr.gradient_accumulation_steps} x {devices} processes x max_seq_len "
        f"{tr.max_seq_len} (full-length sequences"
        + ("" if tr.packing else "; without packing an upper bound")
        + ")"
    )


def _peak_flops(spec: JobSpec, settings: Settings) -> tuple[float | None, str]:
    """One device's peak FLOP/s (None for a GPU type the operator gave none for), and where it comes from."""
    if spec.resources.device != "cuda":
        return (
            settings.cpu_peak_gflops * 1e9,
            f"peak: {settings.cpu_peak_gflops:g} GFLOP/s per CPU process (FTQ_CPU_PEAK_GFLOPS)",
        )
    gpu = settings.gpu_type.upper()
    peak_t = settings.peak_tflops_by_gpu.get(gpu)
    if peak_t is None:
        return None, f"peak FLOP/s unknown: FTQ_GPU_TYPE {settings.gpu_type} not in FTQ_GPU_PEAK_TFLOPS"
    return peak_t * 1e12, f"peak: {peak_t:g} TFLOP/s per {gpu} (FTQ_GPU_TYPE, FTQ_GPU_PEAK_TFLOPS)"


def _seconds(
    spec: JobSpec,
    settings: Settings,
    *,
    tokens: int | None,
    parameters: int | None,
    flops: float | None,
    peak: float | None,
) -> tuple[float | None, str | None]:
    """The run's seconds: from the measured throughput where there is one, else from the FLOPs at the
    assumed utilisation; or None and the reason."""
    devices = spec.resources.world_size
    tps = settings.tokens_per_second_per_device or None
    if tokens is None:
        return None, "the token count is unknown: num_train_epochs without a dataset the preflight could read"
    if tps is not None:
        return tokens / (tps * devices), None
    if not parameters:
        return None, "the parameter count is unknown: the model's config could not be read"
    if not peak:
        return None, (
            f"the peak FLOP/s of a {settings.gpu_type} is unknown (FTQ_GPU_PEAK_TFLOPS); "
            "or set FTQ_TOKENS_PER_SECOND_PER_DEVICE"
        )
    if flops is None:
        return None, None
    return flops / (devices * peak * settings.assumed_mfu), None
