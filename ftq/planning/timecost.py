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

from ftq.contract.plans import Estimate, Parallelism, TimeEstimate
from ftq.contract.spec import JobSpec, looks_local
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
    estimate: Estimate | None = None,
) -> TimeEstimate:
    """The estimate for `spec`; `parameters` from the memory preflight, `run_tokens` (the whole run's)
    from the dataset preflight where it tokenized the data, `estimate` the memory preflight's (its
    parallelism, the model's attention width, KV cache and quantized weights). `assumptions` says what
    each number rests on."""
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
    attention = estimate.attention_width if estimate is not None else None
    if flops is not None and attention and tokens is not None:
        extra_attn, attn_note = attention_flops(spec, tokens, attention)
        flops += extra_attn
        notes.append(attn_note)
    generated, gen_factor, gen_note = generation_terms(spec)
    generation_s = None
    generation_flops = 0.0
    if generated is not None and tokens is not None:
        notes.append(gen_note)
        if flops is not None and parameters:
            flops += tokens * gen_factor * float(parameters)
            # Reported in `flops`, but timed by generation_seconds: decoding is not bound by FLOPs.
            generation_flops = generated * 2 * float(parameters)
        if tps is not None:
            tokens += generated
    seconds, reason = _seconds(spec, settings, tokens=tokens, parameters=parameters, flops=flops, peak=peak)
    if flops is not None:
        flops += generation_flops
    parallelism = estimate.parallelism if estimate is not None else None
    if seconds is not None and tps is None and generated is not None and parameters:
        generation_s, decode_note = generation_seconds(
            spec, settings, parameters=parameters, peak=peak, estimate=estimate
        )
        notes.append(decode_note)
        seconds += generation_s
    comm = None
    if seconds is not None and tps is None and tokens is not None and parameters:
        comm, comm_note = communication_seconds(
            spec,
            settings,
            tokens=tokens,
            parameters=parameters,
            trainable=trainable,
            parallelism=parallelism,
            kv_bytes_per_token=estimate.kv_cache_bytes_per_token if estimate is not None else None,
        )
        if comm_note:
            notes.append(comm_note)
        if comm:
            seconds += comm
        quantized = estimate.quantized_parameters if estimate is not None else None
        if quantized:
            dequant, dequant_note = dequantization_seconds(spec, settings, tokens=tokens, quantized=quantized)
            notes.append(dequant_note)
            seconds += dequant
    if seconds is not None and parameters:
        fetch, fetch_note = fetch_seconds(spec, settings, parameters=parameters)
        if fetch_note:
            notes.append(fetch_note)
            seconds += fetch
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
        generation_seconds=generation_s,
    )


def attention_flops(spec: JobSpec, tokens: int, width: int) -> tuple[float, str]:
    """Attention's own FLOPs, which 6 x parameters leaves out: per token and layer, the scores (QK^T) and
    their use (AV) are 2 x 2 x sequence x heads x head_dim in the forward (PaLM's 12 x layers x width x
    sequence over forward and backward, the count that model-FLOPs utilisation is defined against),
    again with gradient checkpointing's second forward. Each token attends over its sequence,
    max_seq_len at most (an upper bound with packing's shorter documents). At 32k tokens on a 70B model
    this is about 60 % on top of the weights' FLOPs; at 2k, 4 %."""
    seq = spec.training.max_seq_len
    passes = 3 + (1 if spec.training.gradient_checkpointing else 0)
    extra = float(tokens) * passes * 4 * width * seq
    note = (
        f"attention: {passes} x 4 x {width} (layers x heads x head_dim) x max_seq_len {seq} FLOPs per token "
        "(forward, backward" + (", checkpointing's recompute" if passes == 4 else "") + ")"
    )
    return extra, note


def fetch_seconds(spec: JobSpec, settings: Settings, *, parameters: int) -> tuple[float, str | None]:
    """The fetch step's download of a hub model, which runs inside the job's allocation before any rank
    starts (its GPUs idle meanwhile): the 16-bit checkpoint at FTQ_HUB_DOWNLOAD_GBPS. An upper bound: a
    model already in the shared cache downloads nothing. (0, None) for a local model."""
    if looks_local(spec.model.name_or_path):
        return 0.0, None
    size = parameters * 2
    seconds = size / (settings.hub_download_gbps * 1e9)
    note = (
        f"fetch: {spec.model.name_or_path} from the hub, about {size / 1e9:.0f} GB at "
        f"{settings.hub_download_gbps:g} GB/s (FTQ_HUB_DOWNLOAD_GBPS) inside the allocation: "
        f"+{seconds / 3600:.2f} h (none when the shared cache has it)"
    )
    return seconds, note


def dequantization_seconds(
    spec: JobSpec, settings: Settings, *, tokens: int, quantized: int
) -> tuple[float, str]:
    """QLoRA dequantises every 4-bit weight to the compute dtype before each use: read half a byte (and
    its scale), write 2 bytes, read them back in the matmul, in the forward, the backward and
    checkpointing's recompute. Bound by the device's memory bandwidth; a few percent on large batches,
    much more on small ones."""
    passes = 2 + (1 if spec.training.gradient_checkpointing else 0)
    micro = _micro_steps(spec, tokens)
    bandwidth, bw_note = _memory_bandwidth(spec, settings)
    per_pass = quantized * (0.5 + 2 + 2)
    seconds = micro * passes * per_pass / (bandwidth * 1e9) if bandwidth else 0.0
    note = (
        f"QLoRA dequantisation: {quantized} 4-bit weights x 4.5 bytes moved, {passes} passes per "
        f"micro-batch, x{micro}, at {bw_note}: +{seconds / 3600:.2f} h"
    )
    return seconds, note


def _memory_bandwidth(spec: JobSpec, settings: Settings) -> tuple[float | None, str]:
    """One device's memory bandwidth in GB/s (None on CPU or for an unknown GPU type), and its source."""
    if spec.resources.device != "cuda":
        return None, "no device memory bandwidth (CPU)"
    gpu = settings.gpu_type.upper()
    gbps = settings.memory_gbps_by_gpu.get(gpu)
    if gbps is None:
        return None, f"memory bandwidth unknown: FTQ_GPU_TYPE {settings.gpu_type} not in FTQ_GPU_MEMORY_GBPS"
    return gbps, f"{gbps:g} GB/s per {gpu} (FTQ_GPU_MEMORY_GBPS)"


def generation_seconds(
    spec: JobSpec, settings: Settings, *, parameters: int, peak: float | None, estimate: Estimate | None
) -> tuple[float, str]:
    """GRPO's generation time, token step by token step. Decoding is bound by memory bandwidth, not FLOPs:
    every token step reads all the weights (and the KV cache so far) from device memory, however few
    sequences it advances. Each process generates its generation batch (per-device batch x
    steps_per_generation sequences) together, one token step at a time, max_completion_length steps
    (an upper bound: all completions full length), once every steps_per_generation x num_iterations
    micro-batches. A step takes the longest of: the weights and the KV cache over the memory bandwidth,
    the FLOPs at the assumed utilisation, and, under FSDP without vLLM, the all-gather of every layer
    (the sharded model runs its forward hooks at every token step; ZeRO-3 gathers the weights once per
    generation batch instead, and vLLM holds its own full copy)."""
    tr, res = spec.training, spec.resources
    grpo: Any = tr.method_parameters()
    cb = 4 if tr.mixed_precision == "no" else 2
    spg = grpo.steps_per_generation_or(tr.gradient_accumulation_steps)
    micro = (tr.max_steps or 0) * tr.gradient_accumulation_steps
    rounds = math.ceil(micro / (spg * grpo.num_iterations))
    batch = tr.per_device_train_batch_size * spg
    steps = grpo.max_completion_length
    kv_token = estimate.kv_cache_bytes_per_token if estimate is not None else None
    # Prompts keep their last max_seq_len tokens (the trainer's truncation), the completion comes on top.
    prompt = tr.max_seq_len
    # The KV cache read at a token step: every sequence's prompt and its completion so far (on average
    # half of it).
    kv = (kv_token or 0) * batch * (prompt + steps / 2)
    weights = parameters * cb
    bandwidth, bw_note = _memory_bandwidth(spec, settings)
    memory_s = (weights + kv) / (bandwidth * 1e9) if bandwidth else 0.0
    compute_s = 2 * parameters * batch / (peak * settings.assumed_mfu) if peak else 0.0
    gather_s, gather_note = 0.0, ""
    strategy = str(spec.distributed.strategy)
    parallelism = estimate.parallelism if estimate is not None else None
    if not grpo.use_vllm and res.world_size > 1 and res.device == "cuda":
        if strategy == "fsdp":
            shard = parallelism.dp_shard_size if parallelism is not None else res.world_size
            within = shard <= res.processes_per_node
            link = settings.intra_node_gbps if within else settings.inter_node_gbps
            gather_s = weights * (shard - 1) / shard / (link * 1e9)
            gather_note = (
                f"; FSDP re-gathers every layer at every token step ({(shard - 1) / shard:.2f} of "
                f"{weights / 1e9:.1f} GB over {link:g} GB/s: {gather_s * 1e3:.1f} ms)"
            )
        elif strategy == "deepspeed" and spec.distributed.deepspeed.zero_stage == 3:
            world = res.world_size
            link = settings.inter_node_gbps if res.num_nodes > 1 else settings.intra_node_gbps
            per_round = weights * (world - 1) / world / (link * 1e9)
            gather_s = per_round / steps
            gather_note = f"; ZeRO-3 gathers the weights once per generation batch ({per_round:.1f} s)"
    step_s = max(memory_s, compute_s) + gather_s
    if grpo.use_vllm:
        # The trained weights are copied into vLLM's engine once per generation batch.
        step_s += weights / (settings.intra_node_gbps * 1e9) / steps
    total = rounds * steps * step_s
    note = (
        f"generation time: {rounds} generation batches x {steps} token steps of {batch} sequences per "
        f"process; a token step reads {weights / 1e9:.1f} GB of weights and {kv / 1e9:.2f} GB of KV cache at "
        f"{bw_note} ({memory_s * 1e3:.1f} ms; FLOPs {compute_s * 1e3:.1f} ms){gather_note}: "
        f"+{total / 3600:.2f} h"
    )
    return total, note


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
        f"{grpo.num_iterations}), one forward each (2 FLOPs/token/parameter), timed by the token steps "
        "below: decoding is bound by memory bandwidth, not by FLOPs"
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
    spec: JobSpec,
    settings: Settings,
    *,
    tokens: int,
    parameters: int,
    trainable: int | None,
    parallelism: Parallelism | None = None,
    kv_bytes_per_token: int | None = None,
) -> tuple[float | None, str | None]:
    """The collectives' time not hidden behind compute, and the sentence that says how it was counted;
    (None, None) where there is no term (one device, a CPU job). Each collective runs over the slowest
    link of its group: NVLink within a node, the network once the group spans nodes. HSDP gathers and
    reduce-scatters within the node and all-reduces its gradient shard across the nodes; ZeRO++ hpZ
    gathers from the node's secondary copy; context parallelism passes each layer's keys and values
    around its group (ring attention)."""
    res, dist, tr = spec.resources, spec.distributed, spec.training
    world = res.world_size
    if world <= 1 or res.device != "cuda" or str(dist.strategy) == "none":
        return None, None
    width = 4 if tr.mixed_precision == "no" else 2
    grads = trainable if trainable is not None else (parameters if spec.lora is None else 0)
    strategy = str(dist.strategy)
    sharded = strategy == "fsdp" or (strategy == "deepspeed" and dist.deepspeed.zero_stage == 3)
    ppn = res.processes_per_node

    def link(group: int) -> tuple[float, str]:
        if group > ppn:
            return (
                settings.inter_node_gbps,
                f"{settings.inter_node_gbps:g} GB/s between nodes (FTQ_INTER_NODE_GBPS)",
            )
        return (
            settings.intra_node_gbps,
            f"{settings.intra_node_gbps:g} GB/s within a node (FTQ_INTRA_NODE_GBPS)",
        )

    def ring(size: int, group: int) -> float:
        return size * (group - 1) / group / (link(group)[0] * 1e9) if group > 1 else 0.0

    parts: list[str] = []
    if sharded:
        gathers = 2 if strategy == "deepspeed" or dist.fsdp.reshard_after_forward else 1
        shard, replicate, cp, hpz = world, 1, 1, 0
        if parallelism is not None:
            shard, replicate, cp = (
                parallelism.dp_shard_size,
                parallelism.dp_replicate_size,
                parallelism.cp_size,
            )
            hpz = parallelism.zero_hpz_partition_size or 0
        gather_group = hpz or shard
        per_pass_s = ring(gathers * parameters * width, gather_group) + ring(grads * width, shard)
        parts.append(
            f"{gathers} all-gather(s) of the {parameters} weights over {gather_group} GPUs "
            f"({link(gather_group)[1]}) and a reduce-scatter of {grads} gradients over {shard} "
            f"({link(shard)[1]}), {width} bytes each"
        )
        if replicate > 1:
            # HSDP: each GPU's gradient shard is all-reduced with its replicas on the other nodes.
            per_pass_s += ring(2 * grads * width // shard, replicate * ppn)
            parts.append(f"an all-reduce of each 1/{shard} gradient shard across the {replicate} nodes")
        if cp > 1 and tr.max_seq_len:
            # Ring attention: every layer's keys and values of the sequence go round the group, in the
            # forward and twice in the backward.
            kv = (kv_bytes_per_token or 0) * tr.max_seq_len * tr.per_device_train_batch_size
            per_pass_s += 3 * ring(kv, cp)
            parts.append(f"context parallelism's keys and values around {cp} GPUs")
    else:
        per_pass_s = ring(2 * grads * width, world)
        parts.append(
            f"an all-reduce of {grads} gradients ({width} bytes each, twice over a ring) over "
            f"{link(world)[1]}"
        )
    passes = _micro_steps(spec, tokens)
    total = passes * per_pass_s
    exposed = total * (1 - settings.comm_overlap)
    note = (
        f"communication: {'; '.join(parts)} per micro-batch, x{passes} micro-batches, (N-1)/N of each "
        f"through its slowest link: {total / 3600:.2f} h, of which {1 - settings.comm_overlap:g} not hidden "
        f"behind compute (FTQ_COMM_OVERLAP {settings.comm_overlap:g}): +{exposed / 3600:.2f} h"
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
    # Context parallelism splits each sequence over cp GPUs: a step trains devices / cp sequences.
    cp = spec.distributed.fsdp.context_parallel_size if spec.distributed.strategy == "fsdp" else 1
    tokens = tr.max_steps * tr.per_device_train_batch_size * tr.gradient_accumulation_steps * devices
    tokens = tokens * tr.max_seq_len // cp
    return tokens, (
        f"tokens: max_steps {tr.max_steps} x batch {tr.per_device_train_batch_size} x gradient "
        f"accumulation {tr.gradient_accumulation_steps} x {devices} processes x max_seq_len "
        f"{tr.max_seq_len}"
        + (f" / context_parallel_size {cp}" if cp > 1 else "")
        + " (full-length sequences"
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
