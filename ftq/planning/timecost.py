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
- cost: seconds / 3600 x devices x FTQ_PRICE_PER_DEVICE_HOUR, where the operator set a price.
Model loading, evaluation and saving are not counted.
"""

from __future__ import annotations

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
) -> TimeEstimate:
    """The estimate for `spec`; `parameters` from the memory preflight, `run_tokens` (the whole run's)
    from the dataset preflight where it tokenized the data."""
    res, tr = spec.resources, spec.training
    devices = res.world_size
    notes: list[str] = []

    tokens: int | None = None
    if run_tokens is not None:
        tokens = run_tokens
        notes.append(
            "tokens: the dataset preflight's count with the job's tokenizer ("
            + (
                f"{tr.max_steps} steps at the data's mean sequence length"
                if tr.max_steps is not None
                else f"{tr.num_train_epochs or 1.0:g} epochs"
            )
            + ")"
        )
    elif tr.max_steps is not None:
        tokens = tr.max_steps * tr.per_device_train_batch_size * tr.gradient_accumulation_steps * devices
        tokens *= tr.max_seq_len
        notes.append(
            f"tokens: max_steps {tr.max_steps} x batch {tr.per_device_train_batch_size} x gradient "
            f"accumulation {tr.gradient_accumulation_steps} x {devices} processes x max_seq_len "
            f"{tr.max_seq_len} (full-length sequences"
            + ("" if tr.packing else "; without packing an upper bound")
            + ")"
        )
    else:
        notes.append("tokens unknown: num_train_epochs without a dataset token count")

    factor, why = flops_factor(spec)
    notes.append(why)
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
    peak: float | None
    if res.device == "cuda":
        gpu = settings.gpu_type.upper()
        peak_t = settings.peak_tflops_by_gpu.get(gpu)
        if peak_t is None:
            peak = None
            notes.append(f"peak FLOP/s unknown: FTQ_GPU_TYPE {settings.gpu_type} not in FTQ_GPU_PEAK_TFLOPS")
        else:
            peak = peak_t * 1e12
            notes.append(f"peak: {peak_t:g} TFLOP/s per {gpu} (FTQ_GPU_TYPE, FTQ_GPU_PEAK_TFLOPS)")
    else:
        peak = settings.cpu_peak_gflops * 1e9
        notes.append(f"peak: {settings.cpu_peak_gflops:g} GFLOP/s per CPU process (FTQ_CPU_PEAK_GFLOPS)")
    if tps is None:
        mfu = settings.assumed_mfu
        notes.append(f"utilisation: {mfu:g} of peak (FTQ_ASSUMED_MFU) on {devices} device(s)")
    notes.append("not counted: model loading, evaluation, checkpoint and final saves")

    flops = float(tokens) * factor * parameters if tokens is not None and parameters else None
    seconds: float | None = None
    reason: str | None = None
    if tokens is None:
        reason = "the token count is unknown: num_train_epochs without a dataset the preflight could read"
    elif tps is not None:
        seconds = tokens / (tps * devices)
    elif not parameters:
        reason = "the parameter count is unknown: the model's config could not be read"
    elif not peak:
        reason = (
            f"the peak FLOP/s of a {settings.gpu_type} is unknown (FTQ_GPU_PEAK_TFLOPS); "
            "or set FTQ_TOKENS_PER_SECOND_PER_DEVICE"
        )
    elif flops is not None:
        seconds = flops / (devices * peak * settings.assumed_mfu)
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
    )
