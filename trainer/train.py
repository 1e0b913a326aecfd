"""Fine-tuning of a causal LM: TRL's SFT, DPO, KTO, reward and GRPO trainers, optional PEFT LoRA, any
accelerate strategy.

Run it the way the ftq worker does:

    accelerate launch --config_file accelerate_config.yaml -m trainer --spec spec.json --output_dir RUN_DIR

or with the `train.py` flags that trainer/args.py maps onto a spec (local paths on an offline machine):

    accelerate launch --config_file fsdp_config.yaml -m trainer \\
        --model_name ./tiny/model --dataset_name ./tiny/data/train.jsonl --dataset_text_field text \\
        --max_seq_len 128 --max_steps 40 --logging_steps 1 --save_steps 20 --bf16 False --packing True \\
        --output_dir RUN_DIR --per_device_train_batch_size 4 --gradient_accumulation_steps 1 \\
        --use_gradient_checkpointing True --learning_rate 1e-3 --lr_scheduler_type cosine \\
        --weight_decay 0.0 --warmup_ratio 0.1 --use_flash_attn False --use_peft_lora True \\
        --lora_r 8 --lora_alpha 16 --lora_dropout 0.0 --lora_target_modules q_proj,k_proj,v_proj,o_proj

RUN_DIR receives metrics.jsonl, checkpoints/checkpoint-<step>/ and final/ (see ftq.contract.runs).
`--resume_from_checkpoint latest|PATH` continues a run at a checkpoint's step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ftq.contract import progress, runs
from ftq.contract.modelcard import RunFacts, render_model_card
from ftq.contract.spec import LOSS_ON_FORMATS, METHOD_TRAINERS, Device, JobSpec, resolved_save_dtype

from . import trackers
from .args import TrainerArgs
from .callbacks import metrics_callback
from .data import LABELS_COLUMN, TEXT_COLUMN, Splits, load_splits, training_chat_template, trl_rows
from .errors import FtqError, ModelError, SpecError, report_and_exit
from .lean import skip_inference_comm_op, start_up
from .memory import peak_rss, return_freed_blocks_to_os
from .model import (
    check_model_path,
    check_target_modules,
    choose_attn,
    load_adapter,
    load_dtype,
    load_model,
    load_tokenizer,
    lora_config,
)
from .preempt import StopOnSignal, exit_if_stopped, stop_callback
from .preempt import start as listen_for_stop
from .samples import every_steps, samples_callback
from .watch import Watch, raise_if_diverged, watch_callback

log = logging.getLogger("trainer")


def main(args: TrainerArgs) -> None:
    """Train, report, save; an error the user can fix ends as one `ftq-error:` line."""
    try:
        run(args)
    except FtqError as err:
        report_and_exit(err)


def run(args: TrainerArgs) -> None:
    """One run, step by step. Where the run is before its first step and after its last goes to
    progress.jsonl as records (`report_progress`, ftq.contract.progress), which the service shows as
    the job's phase; the log lines the steps write are for people."""
    spec, out = args.spec, args.output_dir
    run_started = time.time()
    with start_up(spec):  # first: before anything imports transformers
        # Before the first large tensor: a rank's freed loading and all-gather buffers leave its memory.
        return_freed_blocks_to_os()
        configure_logging()
        _quiet_progress_bars(heavy=False)
        stop = listen_for_stop()  # SLURM's warning before the time limit may come while the model loads

        splits = check_inputs(spec)
        # A tracker that is down costs seconds here, not minutes of retries once the model is loaded.
        trackers.check_reachable(spec.integrations, out)
        launch = set_up_launch(args, splits)
    data = prepare_data(spec, splits, launch)
    model, peft_config = load_policy(spec, launch, splits.format, out)
    job = build_job(spec, out, launch, data, model, peft_config, stop)
    train(job, spec, out, args.resume_from_checkpoint, stop)
    evaluate_and_sample_last_step(job, spec)
    save_run(job, spec, out, run_started)
    _leave_process_group(job.trainer)


@dataclasses.dataclass
class Launch:
    """What `accelerate launch` set up for this process, and the method's TRL config made under it."""

    state: Any  # accelerate's PartialState: this process's device, rank and the number of processes
    strategy: str  # fsdp, deepspeed, ddp or none (_strategy)
    config: Any  # the method's TRL config (training_config)
    report_to: list[str]  # the trackers (trainer.trackers.configure)
    ram_efficient: bool  # FSDP's RAM-efficient loading: only rank 0 reads the weights


@dataclasses.dataclass
class Data:
    """The tokenizer, and the splits as read from the dataset and in the columns TRL reads."""

    splits: Splits
    tokenizer: Any
    train: Any
    eval: Any | None


@dataclasses.dataclass
class Job:
    """The TRL trainer, with what the steps after training read back."""

    trainer: Any
    launch: Launch
    data: Data
    watch: Watch
    sampler: Any | None  # a SampleWriter (trainer.samples), when the spec asks for sample completions


def check_inputs(spec: JobSpec) -> Splits:
    """The inputs a user can get wrong, checked before torch is even imported: a typo fails in seconds."""
    check_model_path(spec.model)
    _, splits = load_splits(spec.dataset, seed=spec.training.seed, method=str(spec.training.method))
    check_loss_on(spec, splits.format)
    return splits


def set_up_launch(args: TrainerArgs, splits: Splits) -> Launch:
    """Read what the launch set up and make the method's TRL config; logs the `strategy` line."""
    spec, out = args.spec, args.output_dir
    import torch

    if not torch.cuda.is_available():
        # What DeepSpeed's detection picks anyway, said up front: else every rank warns in train.log.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        if _deepspeed_from_env():
            skip_inference_comm_op()
    from accelerate import PartialState

    if args.from_train_py_flags and not torch.cuda.is_available():
        spec.resources.device = Device.cpu  # train.py's flags name no device: use what the machine has

    _quiet_progress_bars(heavy=True)
    out.mkdir(parents=True, exist_ok=True)
    nccl_dump_on_timeout(out)  # before the process group exists: NCCL reads these when it is made
    # The training arguments come first: creating them starts torch.distributed and registers
    # DeepSpeed's config, which from_pretrained needs for FSDP RAM-efficient loading and ZeRO-3 init.
    report_to = trackers.configure(spec.integrations, out)
    config = training_config(
        spec,
        out,
        has_eval=splits.eval is not None,
        fmt=splits.format,
        report_to=report_to,
        process_group_timeout=args.process_group_timeout,
    )
    state = PartialState()
    # The final save's gloo group, made and checked now: a wrong GLOO_SOCKET_IFNAME fails here, not
    # after the whole training run.
    open_save_group()
    strategy = _strategy(state)
    # Read before engaging FSDP on CPU, which hides the flag from accelerate's later plugin parsing.
    ram_efficient = strategy == "fsdp" and _env_flag("FSDP_CPU_RAM_EFFICIENT_LOADING")
    if state.device.type == "cpu" and strategy in ("fsdp", "deepspeed"):
        ram_efficient &= engage_sharding_on_cpu(strategy, config)
    # The record before the log line, as everywhere: a run whose log says it also has its records.
    report_progress(out, progress.RunPhase.loading, progress.LOADING_INPUTS)
    log.info(
        "strategy %s (%s), %d process(es), device %s; eval: %s",
        strategy,
        state.distributed_type,
        state.num_processes,
        state.device,
        splits.eval_note,
    )
    return Launch(state, strategy, config, report_to, ram_efficient)


def prepare_data(spec: JobSpec, splits: Splits, launch: Launch) -> Data:
    """The tokenizer, and the splits in TRL's columns (rank 0 first; the other ranks reuse its cache)."""
    tokenizer = load_tokenizer(spec.model)
    if spec.training.loss_on == "assistant":
        check_assistant_template(tokenizer, spec.model.name_or_path)
    with launch.config.main_process_first(desc="prepare dataset"):
        loss_on, name = str(spec.training.loss_on), spec.model.name_or_path
        train_ds = trl_rows(
            splits.train, spec.dataset, splits.format, tokenizer, loss_on=loss_on, model_name=name
        )
        # Chat rows ftq tokenized with their labels (OpenAI's weights): the eval split's are labelled the
        # same way, whether or not its own rows carry weights.
        tokenize = LABELS_COLUMN in (train_ds.column_names or [])
        eval_ds = (
            trl_rows(
                splits.eval,
                spec.dataset,
                splits.format,
                tokenizer,
                loss_on=loss_on,
                model_name=name,
                tokenize=tokenize,
            )
            if splits.eval
            else None
        )
    return Data(splits, tokenizer, train_ds, eval_ds)


def load_policy(spec: JobSpec, launch: Launch, fmt: str, out: Path) -> tuple[Any, Any]:
    """The model to train, and its LoRA config (None: full fine-tuning); logs the `model` line, and an
    `attention_fallback` warning (a job.warning) where `auto` could not take a flash kernel."""
    method = str(spec.training.method)
    state = launch.state
    requested = str(spec.model.attn_implementation)
    choice = choose_attn(
        requested,
        state.device.type,
        str(spec.training.mixed_precision),
        packing=bool(spec.training.packing),
    )
    attn, fallback = choice.name, choice.fallback
    # Only rank 0 reads the weights; FSDP hands every other rank its shard of them when it wraps.
    placeholders = None
    if launch.ram_efficient and state.process_index != 0:
        placeholders = "cpu" if os.environ.get("FSDP_VERSION", "1") == "2" else "meta"
    dtype = load_dtype(spec, launch.strategy)
    with peak_rss("loading" if placeholders is None else f"loading ({placeholders} placeholders)"):
        try:
            model = load_model(spec, dtype, attn, placeholders=placeholders)
        except ModelError as err:
            if requested != "auto" or attn == "sdpa":
                raise
            # `auto` took a flash kernel that then did not load (FA3 through `kernels` needs the Hub or
            # its cache): the job still runs, on sdpa, and says so.
            fallback = (
                f"model.attn_implementation auto: {attn} did not load ({err}); attention falls back to sdpa"
            )
            attn = "sdpa"
            model = load_model(spec, dtype, attn, placeholders=placeholders)
    if fallback is not None:
        attention_fell_back(fallback, out)
    peft_config = None
    if spec.model.adapter is not None:
        quantized = spec.lora is not None and spec.lora.quantization is not None
        keep = launch.strategy == "deepspeed" and _zero3_from_env() and not quantized and dtype != _float32()
        model = load_adapter(model, spec.model.adapter, keep_model_dtype=keep)
    elif spec.lora is not None:
        check_target_modules(model, spec.lora)
        peft_config = lora_config(spec.lora, task_type="SEQ_CLS" if method == "reward" else "CAUSAL_LM")
    report_progress(out, progress.RunPhase.loading, progress.PREPARING_TRAINER)
    log.info(
        "model %s: attention %s, dtype %s, %s; method %s (%s) on %s data",
        spec.model.name_or_path,
        attn,
        model.dtype,
        f"LoRA on from {spec.model.adapter}"
        if spec.model.adapter
        else (_lora_words(spec, model) if peft_config else "full fine-tuning"),
        method,
        METHOD_TRAINERS[method],
        fmt,
    )
    return model, peft_config


def _lora_words(spec: JobSpec, model: Any) -> str:
    """`LoRA`, or for QLoRA what the base weights really are: how many Linear layers bitsandbytes holds in
    4 bits (none would mean the quantization did not take)."""
    quant = spec.lora.quantization if spec.lora is not None else None
    if quant is None:
        return "LoRA"
    four_bit = sum(1 for m in model.modules() if type(m).__name__ == "Linear4bit")
    return f"QLoRA: {four_bit} Linear layers in 4-bit {quant.type}, computing in {quant.compute_dtype}"


def attention_fell_back(message: str, out: Path) -> None:
    """The attention `auto` fell back to, as a warning every rank logs and rank 0 writes once to
    warnings.jsonl (a job.warning of kind `attention_fallback`): transformers says it at INFO at most."""
    if os.environ.get("RANK", "0") != "0":
        log.warning("%s", message)
        return
    from .watch import write_warnings

    write_warnings(out / runs.WARNINGS, [{"kind": "attention_fallback", "step": None, "message": message}])


def _float32() -> Any:
    import torch

    return torch.float32


def build_job(
    spec: JobSpec,
    out: Path,
    launch: Launch,
    data: Data,
    model: Any,
    peft_config: Any,
    stop: StopOnSignal,
) -> Job:
    """The TRL trainer of the job's method with ftq's callbacks, checked against the launch's strategy."""
    # GRPO's loss is a policy-gradient surrogate near zero that changes sign: against its first value any
    # step is a "spike". Its NaN check stays; the spike and explosion checks are for losses that fit data.
    spike_factor = None if str(spec.training.method) == "grpo" else spec.training.loss_spike_factor
    watch = Watch(spike_factor=spike_factor, stop_on_nan=spec.training.stop_on_nan)
    sampler = sample_writer(spec, out, data)
    callbacks = run_callbacks(spec, out, watch, sampler, stop, trackers_on=bool(launch.report_to))
    rewards = reward_functions(spec, out, is_main=launch.state.is_main_process)
    trainer = build_trainer(
        spec,
        model,
        launch.config,
        data.train,
        data.eval,
        data.tokenizer,
        peft_config,
        callbacks=callbacks,
        reward_funcs=rewards,
    )
    if sampler is not None:
        sampler.attach(trainer)
    if trainer.accelerator.gradient_state.plugin_kwargs.get("sync_each_batch", False):
        log.info(
            "gradient accumulation: gradients reduced at every micro-batch (sync_each_batch; no no_sync)"
        )
    if str(spec.training.method) == "grpo":
        generate_in_lockstep(trainer, launch.strategy, launch.state.num_processes)
        truncate_prompts(trainer, spec.training.max_seq_len)
    if str(spec.training.method) in ("dpo", "kto") or (
        str(spec.training.method) == "grpo" and getattr(trainer, "beta", 0) > 0
    ):
        log.info("reference model: %s", reference_note(trainer, launch.strategy))
    # The metrics callback logs one line per logging step; transformers' printer would add its dict.
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    strategy = launch.strategy
    if (strategy == "fsdp") != trainer.is_fsdp_enabled or (
        strategy == "deepspeed"
    ) != trainer.is_deepspeed_enabled:
        raise RuntimeError(f"launch environment says {strategy}, but the trainer did not set it up")
    return Job(trainer, launch, data, watch, sampler)


def generate_in_lockstep(trainer: Any, strategy: str, processes: int) -> bool:
    """Keep every rank generating until all ranks' completions have ended (transformers' `synced_gpus`)
    where the weights are sharded over several processes; True where that applies.

    Under FSDP each forward all-gathers the layers' shards: a rank whose completions all stopped early
    must go on running forwards while another still generates, or the ranks' collectives pair up across
    different forwards (gloo aborts on the size mismatch; NCCL may hang or pair them silently).
    transformers syncs when ZeRO-3 is on or the model it generates with carries `_is_fsdp_managed_module`;
    TRL passes no `synced_gpus`. torch 2.13 sets that flag on every module FSDP1 wraps and on those
    `fully_shard` (FSDP2) manages, but as an annotation for Dynamo: set here on every module of the
    policy (the same objects FSDP wraps or converts in place), the rule no longer rests on it.
    transformers' continuous batching ignores `synced_gpus` altogether, so it is turned off here."""
    if processes < 2 or strategy not in ("fsdp", "deepspeed"):
        return False
    if strategy == "deepspeed" and not _zero3_from_env():
        return False  # ZeRO-1/2: every rank holds the whole model, its forwards need no collectives
    if strategy == "fsdp":
        for module in trainer.model.modules():
            module._is_fsdp_managed_module = True
    if getattr(trainer.args, "use_transformers_continuous_batching", False):
        log.warning(
            "GRPO: transformers' continuous batching cannot keep sharded ranks generating in step; "
            "generating with padded generate() instead"
        )
        trainer.args.use_transformers_continuous_batching = False
        if hasattr(trainer, "use_transformers_continuous_batching"):
            trainer.use_transformers_continuous_batching = False
    log.info("GRPO generation: ranks generate in lockstep (weights sharded by %s)", strategy)
    return True


def truncate_prompts(trainer: Any, max_tokens: int) -> None:
    """GRPO prompts longer than `training.max_seq_len` tokens keep their last `max_tokens` (TRL 1.x's
    GRPOTrainer truncates nothing and has no max_prompt_length; its predecessor cut from the left, where
    the instructions sit least often). Counted once a step in train.log when any was cut."""
    tokenize = trainer._tokenize_prompts

    def cut(prompts: list[Any]) -> Any:
        prompt_ids, *rest = tokenize(prompts)
        long = [len(ids) for ids in prompt_ids if len(ids) > max_tokens]
        if long:
            log.warning(
                "GRPO: %d of %d prompt(s) over training.max_seq_len %d tokens (longest %d) keep the last %d",
                len(long),
                len(prompt_ids),
                max_tokens,
                max(long),
                max_tokens,
            )
            prompt_ids = [list(ids)[-max_tokens:] for ids in prompt_ids]
        return (prompt_ids, *rest)

    trainer._tokenize_prompts = cut


def reward_functions(spec: JobSpec, out: Path, is_main: bool) -> list[Any] | None:
    """GRPO's reward: the spec's grader as a TRL reward function (trainer.rewards); None for the other
    methods. The main process also writes a few rollouts of each logging step to samples.jsonl."""
    if spec.training.grader is None:
        return None
    from .rewards import GraderReward, limits_from_env

    grpo: Any = spec.training.method_parameters()
    limits = limits_from_env()
    log.info(
        "reward: grader %r (%s); python graders sandboxed: %d s CPU, %d MB, %g s wall clock per batch",
        spec.training.grader.name,
        spec.training.grader.type,
        limits.cpu_seconds,
        limits.memory_mb,
        limits.timeout_seconds,
    )
    return [
        GraderReward(
            spec.training.grader,
            limits,
            rollouts_path=out / runs.SAMPLES if is_main else None,
            rollouts_per_log=grpo.rollouts_per_log,
            logging_steps=spec.training.logging_steps,
        )
    ]


def sample_writer(spec: JobSpec, out: Path, data: Data) -> Any | None:
    """The callback writing samples.jsonl, when the spec asks for samples and the model generates text."""
    if not spec.eval.sample_prompts:
        return None
    if str(spec.training.method) == "reward":
        log.warning("eval.sample_prompts: a reward model scores text and generates none; no samples")
        return None
    # With an eval split: at each evaluation; without: on the eval_steps (else save_steps) cadence.
    return samples_callback(
        out / runs.SAMPLES,
        spec.eval.sample_prompts,
        spec.eval.sample_max_new_tokens,
        tokenizer=data.tokenizer,
        chat=data.splits.format in ("messages", "openai_reinforcement"),
        every_steps=None
        if data.eval is not None
        else every_steps(spec.training.eval_steps, spec.training.save_steps),
    )


def last_step_logger() -> Any:
    """A TrainerCallback that logs the run's last step, whatever `logging_steps` says. transformers logs
    only every `logging_steps` steps, so a run shorter than that (a GRPO try of `max_steps: 2` under the
    default 10) logged no point at all: its follow ended at `step 0/2` and `ftq metrics` had nothing
    (issue 50); and a longer one's last steps (12 under 10) were never shown. The point logged averages
    the loss over the steps since the previous one, as every logged point does."""
    from transformers import TrainerCallback

    class LogLastStep(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if state.max_steps > 0 and state.global_step >= state.max_steps:
                control.should_log = True
            return control

    return LogLastStep()


def train_begin_callback() -> Any:
    """A TrainerCallback for the moment the model is loaded and prepared (FSDP's broadcast of rank 0's
    weights done, a resumed checkpoint read): the process group's timeout comes down to the run's, and
    under FSDP the dtypes of the sharded parameters are logged."""
    from transformers import TrainerCallback

    class TrainBegin(TrainerCallback):
        def on_train_begin(
            self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any
        ) -> None:
            lower_process_group_timeout(float(args.ddp_timeout))
            if model is not None and _env_flag("ACCELERATE_USE_FSDP"):
                log.info("sharded parameters: %s", parameter_dtypes(model))
                log.info("FSDP computes in %s (its mixed-precision policy)", fsdp_compute_dtype())

    return TrainBegin()


def fsdp_compute_dtype() -> str:
    """The dtype FSDP's mixed-precision policy gathers the parameters in for compute (the accelerator
    state's plugin), or `the load dtype` where the policy sets none."""
    from accelerate.state import AcceleratorState

    plugin = getattr(AcceleratorState(), "fsdp_plugin", None)
    dtype = getattr(getattr(plugin, "mixed_precision_policy", None), "param_dtype", None)
    return str(dtype).removeprefix("torch.") if dtype else "the load dtype"


def parameter_dtypes(model: Any) -> str:
    """`frozen bfloat16 (N), trainable float32 (M)`: parameter counts by dtype, frozen and trainable."""
    counts: dict[tuple[bool, str], int] = {}
    for p in model.parameters():
        key = (bool(p.requires_grad), str(p.dtype).removeprefix("torch."))
        counts[key] = counts.get(key, 0) + p.numel()
    parts = [f"{'trainable' if t else 'frozen'} {dtype} ({n:,})" for (t, dtype), n in sorted(counts.items())]
    return ", ".join(parts)


# NCCL's flight recorder: the last collectives of every rank, dumped to the run directory when a
# collective times out, so a hang says which rank waited in which collective.
NCCL_TRACE_ENTRIES = "2000"


def nccl_dump_on_timeout(out: Path) -> None:
    """TORCH_NCCL_DUMP_ON_TIMEOUT with a trace buffer and a dump file in the run directory (a value the
    run's environment already has wins, under its current name or the one torch deprecated). Read when
    NCCL's process group is made; gloo ignores them. The buffer is set under torch's current name: the
    old one prints a deprecation warning at the top of every rank's log."""
    if "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ:
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", NCCL_TRACE_ENTRIES)
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(out / "nccl_trace_rank_"))


def lower_process_group_timeout(loading_s: float, run_s: int | None = None) -> bool:
    """Bring the default process group's timeout from `loading_s` (ddp_timeout) down to `run_s` once the
    model is loaded; True when it was lowered.

    The plan's `--process_group_timeout` is sized for the first collective, where the other ranks wait
    while rank 0 reads the weights: 2 h for 180B. Left in place for the whole run, a real hang would hold
    every GPU that long (32 GPU-hours on 16 GPUs) before NCCL's watchdog ends it. The final save waits in
    a gloo group of its own with its own bound (wait_for_main_process_write), so 30 min suffices here."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    run_s = PROCESS_GROUP_TIMEOUT_MIN_S if run_s is None else run_s
    if loading_s <= run_s or not (dist.is_available() and dist.is_initialized()):
        return False
    if dist.get_world_size() == 1:
        return False
    c10d._set_pg_timeout(datetime.timedelta(seconds=run_s))
    log.info(
        "process group timeout: %d s from the first step (%d s while the model loaded)", run_s, loading_s
    )
    return True


def run_callbacks(
    spec: JobSpec, out: Path, watch: Watch, sampler: Any | None, stop: StopOnSignal, trackers_on: bool
) -> list[Any]:
    """ftq's TrainerCallbacks, in the order they must run at each step."""
    metrics_writer = metrics_callback(out / runs.METRICS)
    # The watch after the metrics writer: it reads the throughput of the point just written.
    callbacks = [
        last_step_logger(),
        train_begin_callback(),
        metrics_writer,
        watch_callback(watch, out, metrics_writer),
        stop_callback(stop),
    ]
    if sampler is not None:
        callbacks.append(sampler)
    if trackers_on:
        callbacks.append(trackers.recorder_callback(spec.integrations, out))
    return callbacks


def train(job: Job, spec: JobSpec, out: Path, resume_from: str | None, stop: StopOnSignal) -> None:
    """trainer.train, from the checkpoint asked for; a run stopped by a signal or a diverged loss ends here
    (checkpointed, or as `diverged`); logs the `resuming` and `trained to step` lines."""
    trainer = job.trainer
    started = time.time()
    resume = resume_path(resume_from, out)
    if resume is not None:
        report_progress(out, progress.RunPhase.loading, progress.RESUMING)
        # Said once per run so the log shows where a continued run picked up.
        log.info("resuming from %s", resume)
    trackers.start(spec.integrations, out, is_main=job.launch.state.is_main_process)
    trainer.train(resume_from_checkpoint=resume)
    exit_if_stopped(stop, trainer, out)  # stopped early by a signal: checkpointed, exits here
    if job.watch.diverged_at is not None:
        _leave_process_group(trainer)
        raise_if_diverged(job.watch, out)  # the loss became NaN: no final save; ends as `diverged`
    report_progress(
        out,
        progress.RunPhase.saving,
        progress.SAVING_FINAL,
        step=trainer.state.global_step,
        max_steps=trainer.state.max_steps,
    )
    log.info("trained to step %d in %.1fs", trainer.state.global_step, time.time() - started)


def report_progress(
    out: Path,
    phase: progress.RunPhase,
    message: str,
    *,
    step: int | None = None,
    max_steps: int | None = None,
) -> None:
    """Rank 0 appends a record to progress.jsonl: where the run is, for the job's `progress.phase`. A
    record that cannot be written costs the job its phase message, never its run."""
    if os.environ.get("RANK", "0") != "0":
        return
    try:
        progress.append(out / runs.PROGRESS, progress.record(phase, message, step=step, max_steps=max_steps))
    except OSError as err:
        log.warning("could not write %s: %s", runs.PROGRESS, err)


def evaluate_and_sample_last_step(job: Job, spec: JobSpec) -> None:
    """The last step was not an eval step: evaluate once more, so the run ends with its final eval loss
    (and its last samples); then close the trackers, which report that eval too."""
    trainer = job.trainer
    eval_steps = spec.training.eval_steps
    if job.data.eval is not None and (eval_steps is None or trainer.state.global_step % eval_steps != 0):
        trainer.evaluate()
    if job.sampler is not None:
        job.sampler.final()  # every rank, where the model is sharded; a no-op when the last eval sampled
    trackers.finish(spec.integrations, is_main=job.launch.state.is_main_process)


def save_run(job: Job, spec: JobSpec, out: Path, run_started: float) -> None:
    """final/ (every rank takes part in the gather), then its model card on rank 0; logs `saved`."""
    trainer = job.trainer
    with peak_rss("final save"):
        save_final(
            trainer,
            out / runs.FINAL,
            job.data.tokenizer,
            job.launch.strategy,
            save_dtype=resolved_save_dtype(spec.training.save_dtype, spec.training.mixed_precision),
        )
    if trainer.accelerator.is_main_process:
        facts = run_facts(trainer, job.data.splits, job.launch.state, time.time() - run_started)
        write_model_card(spec, facts, out)
    log.info("saved %s", out / runs.FINAL)


def _leave_process_group(trainer: Any) -> None:
    # Leave the process group explicitly, all ranks together: left to interpreter shutdown, a rank's
    # communication threads can be torn down mid-flight ("terminate called without an active
    # exception", SIGABRT) and the run fails after it has saved everything.
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        trainer.accelerator.wait_for_everyone()
        dist.destroy_process_group()


def run_facts(trainer: Any, splits: Any, state: Any, wall_seconds: float) -> RunFacts:
    """What the model card says about this run, from the trainer's state at the final save."""
    history = trainer.state.log_history
    train_loss = next((h["loss"] for h in reversed(history) if "loss" in h), None)
    eval_loss = next((h["eval_loss"] for h in reversed(history) if "eval_loss" in h), None)
    tokens = int(trainer.state.num_input_tokens_seen or 0) or next(
        (int(h["num_tokens"]) for h in reversed(history) if "num_tokens" in h), None
    )
    return RunFacts(
        job_id=os.environ.get("FTQ_JOB_ID"),
        train_rows=len(splits.train),
        eval_rows=len(splits.eval) if splits.eval is not None else None,
        steps=int(trainer.state.global_step),
        train_loss=float(train_loss) if train_loss is not None else None,
        eval_loss=float(eval_loss) if eval_loss is not None else None,
        tokens=tokens,
        wall_seconds=round(wall_seconds, 1),
        device=state.device.type,
        devices=int(state.num_processes),
    )


def write_model_card(spec: JobSpec, facts: RunFacts, out: Path) -> None:
    """final/README.md, and the facts beside final/ that an export renders its own card from (rank 0)."""
    (out / runs.CARD_FACTS).write_text(facts.to_json())
    (out / runs.FINAL / runs.MODEL_CARD).write_text(render_model_card(spec.model_dump(mode="json"), facts))


def quiet_bitsandbytes() -> None:
    """bitsandbytes (the qlora extra) is imported by transformers and peft whenever it is installed, and
    on a CPU machine warns, in every run, that the optional `kernels` package is missing: its own CPU
    path runs instead, and no job could do anything about it. Its errors stay."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def configure_logging() -> None:
    """train.log is read by people: INFO from rank 0 alone (the others said the same), warnings from all,
    and none of accelerate's INFO. Every rank's memory lines stay (trainer.memory): they differ by rank
    and the memory tests read them."""
    import warnings

    main_rank = os.environ.get("RANK", "0") == "0"
    logging.basicConfig(
        level=logging.INFO if main_rank else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("trainer.memory").setLevel(logging.INFO)
    # accelerate narrates each shard and optimizer file it saves or loads (four lines per FSDP checkpoint,
    # with their paths); a checkpoint is a job.checkpoint event once whole, and a resume is the trainer's
    # own `resuming from` line. Its warnings and errors stay.
    logging.getLogger("accelerate").setLevel(logging.WARNING)
    quiet_bitsandbytes()
    # transformers 5 calls its own deprecated name from inside; nothing the job could change.
    warnings.filterwarnings(
        "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )


def training_config(
    spec: JobSpec,
    out: Path,
    has_eval: bool,
    fmt: str = "text",
    report_to: list[str] | None = None,
    process_group_timeout: int | None = None,
) -> Any:
    """The job spec as the TRL config of its method (SFTConfig, DPOConfig, KTOConfig, RewardConfig);
    `report_to`: the trackers (trainer.trackers.configure), none by default."""
    config = _method_config(spec, out, has_eval, fmt, report_to, process_group_timeout)
    hpz = apply_zero_hpz(config)
    if hpz:
        log.info("ZeRO++ hpZ: a 16-bit copy of the weights sharded over %d GPUs a node for the gathers", hpz)
    return config


def _method_config(
    spec: JobSpec,
    out: Path,
    has_eval: bool,
    fmt: str,
    report_to: list[str] | None,
    process_group_timeout: int | None,
) -> Any:
    method = str(spec.training.method)
    if method == "sft":
        return sft_config(
            spec, out, has_eval, fmt, report_to=report_to, process_group_timeout=process_group_timeout
        )
    common = common_config_args(
        spec, out, has_eval, report_to=report_to, process_group_timeout=process_group_timeout
    )
    t = spec.training
    if method == "dpo":
        from trl import DPOConfig

        # training.dpo and training.kto are DPOConfig's and KTOConfig's own names (enums as strings).
        dpo: dict[str, Any] = _method_block(t)
        if not isinstance(dpo["loss_type"], list):
            dpo["loss_type"] = [dpo["loss_type"]]  # DPOConfig takes a list (several losses, weighted)
        return DPOConfig(**common, max_length=t.max_seq_len, **dpo)
    if method == "kto":
        from trl import KTOConfig

        kto = _method_block(t)
        return KTOConfig(**common, max_length=t.max_seq_len, **kto)
    if method == "reward":
        from trl import RewardConfig

        reward: Any = t.method_parameters()
        return RewardConfig(
            **common, max_length=t.max_seq_len, center_rewards_coefficient=reward.center_rewards_coefficient
        )
    if method == "grpo":
        return grpo_config(spec, common)
    raise SpecError(f"training.method {method} is not one this trainer runs")


def _method_block(training: Any) -> dict[str, Any]:
    """The method's own block (defaults where the spec left it out) under its TRL config's names."""
    block = training.method_parameters()
    assert block is not None, f"{training.method} has no block of its own"
    return dict(block.model_dump(mode="json"))


def grpo_config(spec: JobSpec, common: dict[str, Any]) -> Any:
    """TRL's GRPOConfig: the spec's `training.grpo` names as they are, generation with transformers (or
    vLLM colocated in the training processes), TRL's own completion logging off (ftq writes rollouts to
    samples.jsonl), and the token count TRL keeps itself (prompt and completion tokens of every rank)."""
    from trl import GRPOConfig

    g: Any = spec.training.method_parameters()
    common = {**common, "include_num_input_tokens_seen": "no"}  # GRPOTrainer counts them as it generates
    # training.grpo's fields are GRPOConfig's own names (enums as their strings), but for ftq's own
    # `rollouts_per_log` (how many rollouts a step writes to samples.jsonl).
    return GRPOConfig(
        **common,
        **g.model_dump(mode="json", exclude={"rollouts_per_log"}),
        vllm_mode="colocate",
        log_completions=False,
    )


def common_config_args(
    spec: JobSpec,
    out: Path,
    has_eval: bool,
    packing: bool = False,
    report_to: list[str] | None = None,
    process_group_timeout: int | None = None,
) -> dict[str, Any]:
    """The TrainingArguments every method's config takes from the spec alike. `process_group_timeout`
    (the plan's `--process_group_timeout`, sized from the model's load) becomes `ddp_timeout`: the
    timeout of the process group that creating these arguments starts, and so of the first collective,
    where the other ranks wait while rank 0 reads the weights; never under the default 30 min."""
    t = spec.training
    if spec.training.eval_steps is not None and not has_eval:
        log.warning("training.eval_steps is set but dataset.eval_split is not: no evaluation will run")
    eval_every = has_eval and t.eval_steps is not None
    checkpointing = checkpointing_args(
        t.gradient_checkpointing, reentrant=spec.lora is not None and _zero3_from_env()
    )
    return dict(
        output_dir=str(out / runs.CHECKPOINTS),
        max_steps=t.max_steps if t.max_steps is not None else -1,
        num_train_epochs=t.num_train_epochs if t.num_train_epochs is not None else 1.0,
        per_device_train_batch_size=t.per_device_train_batch_size,
        per_device_eval_batch_size=t.per_device_eval_batch_size or t.per_device_train_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        learning_rate=t.learning_rate,
        lr_scheduler_type=str(t.lr_scheduler_type),
        warmup_steps=t.warmup_ratio,  # transformers 5: a float below 1 is a ratio of the total steps
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        logging_strategy="steps",
        logging_steps=t.logging_steps,
        eval_strategy="steps" if eval_every else "no",
        eval_steps=t.eval_steps if eval_every else None,
        save_strategy="steps" if t.save_steps else "no",
        save_steps=t.save_steps or 500,
        save_total_limit=rotation_limit(spec),
        bf16=t.mixed_precision == "bf16",
        fp16=t.mixed_precision == "fp16",
        use_cpu=spec.resources.device == "cpu",
        seed=t.seed,
        **checkpointing,
        # Packing here is BFD, which TRL runs padding-free: one flattened row, no padding and no attention
        # mask, so "non_padding" would count ids != pad, and with pad == EOS (Llama ships no pad token)
        # drop every document's EOS from tokens/s. Unpacked batches have a mask that "non_padding" reads.
        include_num_input_tokens_seen="all" if packing else "non_padding",
        ddp_find_unused_parameters=False,
        ddp_timeout=max(PROCESS_GROUP_TIMEOUT_MIN_S, process_group_timeout or 0),
        accelerator_config=plan_accelerator_config(),
        report_to=report_to or "none",
        run_name=out.name,  # the job id: the trackers' run name
        disable_tqdm=True,  # no progress bars in train.log: the metrics callback logs one line per step
        log_level="warning",  # transformers' info level dumps the model config into train.log at every save
    )


# What the plan decided and only the trainer can apply (ftq.planning.render.plan_env_lines exports them).
SYNC_EACH_BATCH_ENV = "FTQ_SYNC_EACH_BATCH"
ZERO_HPZ_ENV = "FTQ_ZERO_HPZ_PARTITION_SIZE"


def plan_accelerator_config() -> dict[str, Any] | None:
    """TrainingArguments' `accelerator_config` for the plan's FTQ_SYNC_EACH_BATCH=1 (FSDP full fine-tuning
    with gradient accumulation): accelerate's GradientAccumulationPlugin `sync_each_batch`, so that
    transformers runs no micro-batch under `no_sync` and FSDP2 reduce-scatters the gradients at every one
    instead of keeping full-size gradients on every GPU until the last. None (transformers' defaults)
    otherwise."""
    if not _env_flag(SYNC_EACH_BATCH_ENV):
        return None
    return {"gradient_accumulation_kwargs": {"sync_each_batch": True}}


def apply_zero_hpz(config: Any) -> int | None:
    """The plan's FTQ_ZERO_HPZ_PARTITION_SIZE (ZeRO++ hpZ under multi-node ZeRO-3) written into the
    DeepSpeed config the training arguments made from the launch (`zero_optimization.
    zero_hpz_partition_size`): the plugin's dict is the one the Trainer's Accelerator hands DeepSpeed
    (transformers' propagate_args_to_deepspeed starts from it), and the copy ZeRO-3 init reads in
    from_pretrained is made again from it. The size set, or None where the plan exported none or the
    launch is not DeepSpeed."""
    raw = os.environ.get(ZERO_HPZ_ENV, "").strip()
    plugin = getattr(config, "deepspeed_plugin", None)
    if not raw or plugin is None:
        return None
    size = int(raw)
    if size <= 1:
        return None
    plugin.deepspeed_config.setdefault("zero_optimization", {})["zero_hpz_partition_size"] = size
    plugin.set_deepspeed_weakref()  # the copy transformers' ZeRO-3 init (from_pretrained) reads
    return size


def sft_config(
    spec: JobSpec,
    out: Path,
    has_eval: bool,
    fmt: str = "text",
    report_to: list[str] | None = None,
    process_group_timeout: int | None = None,
) -> Any:
    """The job spec as TRL's SFTConfig (TRL 1.x / transformers 5 names)."""
    from trl import SFTConfig

    t = spec.training
    return SFTConfig(
        **common_config_args(
            spec,
            out,
            has_eval,
            packing=t.packing,
            report_to=report_to,
            process_group_timeout=process_group_timeout,
        ),
        max_length=t.max_seq_len,
        packing=t.packing,
        packing_strategy="bfd",
        dataset_text_field=TEXT_COLUMN,
        # Which tokens carry the loss is the spec's choice, never TRL's default for the data (TRL would
        # mask prompts of prompt/completion data unasked): `all` trains on every token.
        completion_only_loss=t.loss_on == "completion" and fmt == "prompt_completion",
        assistant_only_loss=t.loss_on == "assistant",
    )


def check_loss_on(spec: JobSpec, fmt: str) -> None:
    """training.loss_on must be one the data's format can mask (the spec checks it when the format is
    given; with `format: auto` only the columns decide)."""
    loss_on = str(spec.training.loss_on)
    if loss_on != "all" and fmt not in LOSS_ON_FORMATS[loss_on]:
        raise SpecError(
            f"training.loss_on {loss_on} needs {' or '.join(LOSS_ON_FORMATS[loss_on])} data; "
            f"dataset {spec.dataset.name_or_path} is {fmt} data"
        )


def check_assistant_template(tokenizer: Any, model_name: str) -> None:
    """`loss_on: assistant` needs a chat template that marks the assistant turns ({% generation %}), or one
    TRL knows how to rewrite with the markers; otherwise no token could be told apart, and training on all
    of them instead would silently be another job than the one asked for."""
    from trl.chat_template_utils import has_generation_markers

    template = getattr(tokenizer, "chat_template", None)
    fix = (
        "give the model a chat template whose assistant turns are wrapped in {% generation %}..."
        "{% endgeneration %} (tokenizer_config.json chat_template, or chat_template.jinja), or set "
        "training.loss_on: all"
    )
    if not template:
        raise ModelError(f"loss_on assistant: the tokenizer of {model_name} has no chat template; {fix}")
    if has_generation_markers(template):
        return
    if training_chat_template(tokenizer) is None:
        raise ModelError(
            f"loss_on assistant: the chat template of {model_name} does not mark the assistant turns "
            f"({{% generation %}}), and it is not one TRL can rewrite with the markers; {fix}"
        )
    log.info("loss_on assistant: the chat template has no generation markers; TRL's training copy adds them")


def build_trainer(
    spec: JobSpec,
    model: Any,
    config: Any,
    train_ds: Any,
    eval_ds: Any,
    tokenizer: Any,
    peft_config: Any,
    callbacks: list[Any],
    reward_funcs: list[Any] | None = None,
) -> Any:
    """The TRL trainer of the job's method, on the model this process loaded (GRPO: with `reward_funcs`).

    DPO and KTO with LoRA pass no reference model: TRL then scores the reference with the adapter
    disabled, so no second copy is loaded. Full fine-tuning leaves ref_model None too, and TRL loads the
    reference from the same path with the policy's dtype, then prepares it as the launch prepares models
    (ZeRO-3: partitioned like the policy; FSDP: sharded by prepare_fsdp; DDP: a replica per process), in
    evaluation mode: weights only, no gradients or optimizer state.
    """
    import importlib

    # Only the method's trainer: each of TRL's trainer modules imports more of its own (GRPO's, vLLM's
    # client and generation helpers).
    module, _, name = METHOD_TRAINERS[str(spec.training.method)].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    if getattr(config, "assistant_only_loss", False) and LABELS_COLUMN in (train_ds.column_names or []):
        # Rows ftq tokenized with their labels (OpenAI chat rows: trainer.data.openai_chat_rows), the
        # assistant-only loss and the weights already in them: TRL uses such labels as they are, and its
        # assistant_only_loss, which is for conversations it tokenizes itself, refuses these rows.
        config.assistant_only_loss = False
    if name == "GRPOTrainer":
        return cls(
            model=model,
            reward_funcs=reward_funcs,
            args=config,
            train_dataset=train_ds,
            eval_dataset=eval_ds,
            processing_class=tokenizer,
            peft_config=peft_config,
            callbacks=callbacks,
        )
    trainer = cls(
        model=model,
        args=config,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
    )
    return trainer


def reference_note(trainer: Any, strategy: str) -> str:
    """What serves as the reference of a DPO, KTO or GRPO (beta > 0) run (train.log)."""
    if getattr(trainer, "ref_model", None) is None:
        if getattr(trainer.args, "precompute_ref_log_probs", False):
            return "log-probabilities precomputed before training (none kept in memory)"
        return "the base model with the LoRA adapter disabled (no second copy loaded)"
    how = {"fsdp": "sharded by FSDP", "deepspeed": "prepared by DeepSpeed"}.get(
        strategy, "one copy per process"
    )
    return f"a second copy of the model, {how}, in evaluation mode (weights only)"


def rotation_limit(spec: JobSpec) -> int | None:
    """transformers' save_total_limit, except where checkpoints are evaluated (`eval.on: checkpoint`):
    then the worker rotates them, so that the best one and those still waiting to be scored are kept
    (worker.evaluations.rotate)."""
    if spec.eval.suites and spec.eval.on == "checkpoint":
        return None
    return spec.training.save_total_limit


def checkpointing_args(enabled: bool, reentrant: bool) -> dict[str, Any]:
    """Activation checkpointing as SFTConfig fields, `use_reentrant` always explicit.

    Non-reentrant checkpointing is the kind that works with frozen inputs and FSDP's sharding. LoRA under
    ZeRO-3 (the Falcon job) needs reentrant: non-reentrant recomputation re-checks the frozen weights,
    which ZeRO-3 has partitioned back to empty by then (DeepSpeed fixed that only in 0.19.3). TRL forces
    reentrant there too, but into the deprecated `gradient_checkpointing_kwargs`, a fresh dict when none
    was given, which transformers 5.2x no longer reads: `activation_checkpointing_kwargs` stays None and
    transformers' default, non-reentrant, applies. A dict given here is the one object both names share.
    """
    from trl import SFTConfig

    # transformers 5.2x renamed gradient_checkpointing to activation_checkpointing; older 5.x: old name only.
    names = {f.name for f in dataclasses.fields(SFTConfig)}
    ckpt = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    kwargs = {"use_reentrant": reentrant} if enabled else None
    return {ckpt: enabled, f"{ckpt}_kwargs": kwargs}


def resume_path(resume: str | None, out: Path) -> str | None:
    """`latest` is this run's newest checkpoint that can be resumed (none yet: start from step 0); else a
    folder. transformers' own `get_last_checkpoint` takes the highest step whatever its state, so a job
    killed while saving would resume from a folder without trainer_state.json and fail."""
    if resume is None:
        return None
    if resume != "latest":
        return resume
    last = runs.latest_checkpoint(out)
    if last is None:
        log.warning(
            "--resume_from_checkpoint latest: no complete checkpoint under %s yet, starting at step 0",
            out / runs.CHECKPOINTS,
        )
        return None
    skipped = [c.path.name for c in runs.list_checkpoints(out) if c.step > last.step]
    if skipped:
        log.warning("--resume_from_checkpoint latest: passing over incomplete %s", ", ".join(skipped))
    return str(last.path)


def save_final(
    trainer: Any, final_dir: Path, tokenizer: Any, strategy: str, save_dtype: str = "fp32"
) -> None:
    """Write `final/`: the LoRA adapter, or a full model that from_pretrained loads, plus the tokenizer.

    Intermediate checkpoints stay sharded under FSDP (each rank writes its shard: fast, resumable); only this
    save gathers a full state dict, and under LoRA only the adapter's: the frozen base is what the job
    started from, and gathering it to rank 0's CPU would take ~276 GB for 70B in float32. Under ZeRO-3
    the 16-bit weights are gathered whatever the config's `zero3_save_16bit_model` says, so `final/` is
    always loadable. Every rank takes part in the gather, then waits for rank 0 to finish writing. A full
    model is written in `save_dtype` (`training.save_dtype`, resolved): 138 GB in bf16 for 70B, not 276.
    """
    from peft import PeftModel

    acc = trainer.accelerator
    is_peft = isinstance(acc.unwrap_model(trainer.model), PeftModel)
    state_dict = None
    if strategy == "fsdp" and is_peft:
        state_dict = trainable_state_dict(trainer.model)
    elif strategy == "fsdp":
        state_dict = full_state_dict(acc, trainer.model)
    elif strategy == "deepspeed" and trainer.model_wrapped.zero_optimization_partition_weights():
        # Under LoRA only the adapter is saved: gathering the frozen base would be wasted traffic.
        state_dict = trainer.model_wrapped._zero3_consolidated_16bit_state_dict(
            exclude_frozen_parameters=is_peft
        )
    if not is_peft and acc.is_main_process:
        if state_dict is None:
            state_dict = acc.unwrap_model(trainer.model).state_dict()
        state_dict = cast_state_dict(state_dict, save_dtype)
    nbytes = sum(t.numel() * t.element_size() for t in (state_dict or {}).values())
    with wait_for_main_process_write(nbytes):
        if acc.is_main_process:
            model = acc.unwrap_model(trainer.model)
            save_full_or_adapter(model, final_dir, state_dict)
            if is_peft:
                _unwrapped_adapter_names(final_dir / "adapter_model.safetensors")
            tokenizer.save_pretrained(str(final_dir))


SAVE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def cast_state_dict(state_dict: dict[str, Any], save_dtype: str) -> dict[str, Any]:
    """The floating-point tensors in `save_dtype` (bf16|fp16|fp32), replaced in the dict one at a time (so
    a gathered dict's peak grows by one tensor, not the model); tensors that share storage (tied
    embeddings) stay shared, integer buffers are left alone. The config's `dtype` follows on save."""
    import torch

    dtype = getattr(torch, SAVE_DTYPES[save_dtype])
    done: dict[tuple[Any, ...], Any] = {}
    out = state_dict
    for key, tensor in list(state_dict.items()):
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or tensor.dtype == dtype:
            continue
        same = (tensor.device, tensor.data_ptr(), tuple(tensor.shape), tensor.stride())
        if same not in done:
            done[same] = tensor.detach().to(dtype)
        out[key] = done[same]
    return out


def save_full_or_adapter(model: Any, final_dir: Path, state_dict: dict[str, Any] | None) -> None:
    """`save_pretrained` with the given state dict; for a full model, config.json's dtype says what the
    weights are, so from_pretrained(dtype="auto") loads them as saved."""
    model.save_pretrained(str(final_dir), state_dict=state_dict, safe_serialization=True)
    if state_dict and not hasattr(model, "peft_config"):
        # save_pretrained writes the in-memory parameters' dtype (the fp32 master weights) to config.json.
        floats = {t.dtype for t in state_dict.values() if getattr(t, "is_floating_point", bool)()}
        if len(floats) == 1:
            was = model.config.dtype
            model.config.dtype = next(iter(floats))
            model.config.save_pretrained(str(final_dir))
            model.config.dtype = was


def full_state_dict(acc: Any, model: Any) -> dict[str, Any]:
    """The whole model gathered to rank 0's CPU, one FSDP unit at a time ({} elsewhere)."""
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if not isinstance(model, FSDP):  # FSDP2
        acc.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
        gathered: dict[str, Any] = acc.get_state_dict(model)
        return gathered
    # accelerate always asks FSDP1 to offload to the CPU, which on a CPU run reads a tensor FSDP has
    # already freed (a segfault in torch 2.13); there the gathered tensors are in host memory anyway.
    config = FullStateDictConfig(offload_to_cpu=acc.device.type != "cpu", rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
        gathered = model.state_dict()
    return gathered


def trainable_state_dict(model: Any) -> dict[str, Any]:
    """The full (unsharded) values of the trainable parameters only, on rank 0's CPU ({} elsewhere).

    The frozen base never leaves its shards: gathering it is what would put ~276 GB (70B, float32) on
    rank 0. FSDP2's sharded state dict costs nothing, so torch drops the frozen entries before it
    gathers the rest. FSDP1 builds even a sharded state dict by unsharding every unit and copying each
    rank's chunk of every parameter (1/N of the model per rank), so there each unit is unsharded on its
    own, and rank 0 copies out its trainable parameters before the next one.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel):
        return _fsdp1_trainable_state_dict(model)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return get_model_state_dict(model, options=options)


def _fsdp1_trainable_state_dict(root: Any) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    # use_orig_params keeps each parameter object through (un)sharding: its id names it in every unit.
    names = {id(p): _peft_key(n) for n, p in root.named_parameters()}
    on_rank_0 = dist.get_rank() == 0
    gathered: dict[str, Any] = {}
    for unit in FSDP.fsdp_modules(root):  # the same order on every rank: each summon is collective
        nested = {id(p) for inner in FSDP.fsdp_modules(unit) if inner is not unit for p in inner.parameters()}
        trainable = [p for p in unit.parameters() if id(p) not in nested and p.requires_grad]
        if not trainable:
            continue
        with FSDP.summon_full_params(unit, recurse=False, writeback=False):
            if on_rank_0:
                for p in trainable:
                    gathered[names[id(p)]] = p.detach().to("cpu", copy=True)
    return gathered


WRAPPERS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")


def _peft_key(name: str) -> str:
    """A parameter's name as PEFT's save_pretrained expects it from the unwrapped model.

    PEFT (0.21) matches keys against its module names, which keep FSDP1's inner wrappers (each decoder
    layer is a unit, and so is each LoRA `lora_A.default` that accelerate wraps apart from the frozen
    weights), and drops the adapter name only where it is next to last: the root's wrapper and one
    between the adapter name and the tensor's own name go. Any other key is silently left out.
    """
    module, _, leaf = name.removeprefix(WRAPPERS[0] + ".").rpartition(".")
    for wrapper in WRAPPERS:
        module = module.removesuffix("." + wrapper)
    return f"{module}.{leaf}"


def _unwrapped_adapter_names(adapter_file: Path) -> None:
    """Rewrite a saved adapter whose tensor names carry FSDP1's inner wrappers with the model's names.

    PEFT (0.21) names adapter tensors after the module tree it is given, and under FSDP1 every decoder
    layer is a nested unit: left alone, a LoRA job's final/ would be empty or would not load.
    """
    from safetensors.torch import load_file, save_file

    tensors = load_file(adapter_file)
    if not tensors:
        raise RuntimeError(f"{adapter_file} holds no tensors: the adapter was lost on the way to the save")
    renamed = {}
    for name, tensor in tensors.items():
        for wrapper in WRAPPERS:
            name = name.replace(wrapper + ".", "")
        renamed[name] = tensor
    if renamed.keys() != tensors.keys():
        save_file(renamed, adapter_file, metadata={"format": "pt"})


# The process group's timeout (TrainingArguments' ddp_timeout) is never under its usual 30 min.
PROCESS_GROUP_TIMEOUT_MIN_S = 1800
# The gloo group the final save waits in (wait_for_main_process_write), made at start by open_save_group.
_save_group: Any = None


def open_save_group() -> Any:
    """Make the final save's gloo group on every rank and pass one barrier in it; None on one process.

    Made at the end, a gloo group that cannot connect (a wrong GLOO_SOCKET_IFNAME on a GPU cluster, where
    the training itself runs over NCCL) would fail only after the whole training run."""
    global _save_group
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    if _save_group is None:
        group = dist.new_group(backend="gloo")
        dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=PROCESS_GROUP_TIMEOUT_MIN_S))
        _save_group = group
        log.info("final save group (gloo) ready on %d ranks", dist.get_world_size())
    return _save_group


# Writing a 70B model to a shared filesystem can take longer than any collective timeout; the wait
# is given a bound that grows with what is written, assuming a slow 25 MB/s, and never under 30 min.
SAVE_WAIT_MIN_S = 1800.0
SAVE_WAIT_BYTES_PER_S = 25e6


def save_wait_timeout(nbytes: int) -> float:
    return max(SAVE_WAIT_MIN_S, nbytes / SAVE_WAIT_BYTES_PER_S)


@contextlib.contextmanager
def wait_for_main_process_write(nbytes: int) -> Iterator[None]:
    """Let rank 0 write (the body) while the other ranks wait on a timeout sized by what it writes.

    Waiting in an ordinary barrier would count against the process group's timeout (`ddp_timeout`,
    30 min; NCCL's watchdog then kills the job) while rank 0 writes hundreds of GB. The wait is a gloo
    `monitored_barrier` in a group made for it: it blocks no GPU stream, its timeout is its own, and
    it still ends with an error naming rank 0 if rank 0 never arrives. `nbytes` is rank 0's.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        yield
        return
    # Made at start (open_save_group); else here, by every rank before rank 0 starts writing.
    group = open_save_group()
    size = [nbytes]
    dist.broadcast_object_list(size, src=0, group=group)
    timeout = save_wait_timeout(int(size[0]))
    if dist.get_rank() == 0:
        log.info("final save: %.1f GB to write; the other ranks wait up to %.0f s", size[0] / 1e9, timeout)
    yield
    dist.monitored_barrier(group=group, timeout=datetime.timedelta(seconds=timeout), wait_all_ranks=True)


def engage_sharding_on_cpu(strategy: str, config: Any) -> bool:
    """Set up accelerate's shared state for FSDP or DeepSpeed on a CPU-only launch; True when engaged.

    accelerate (1.15) quietly runs an FSDP or DeepSpeed config as plain multi-process DDP when the
    device is the CPU (`use_cpu: true`), although torch's FSDP2 and FSDP1 (over gloo) and DeepSpeed's
    CPU accelerator all work there. The accelerator state is a process-wide singleton, so initialising
    it here as the launch asked is what the trainer's Accelerator then picks up. GPUs need none of this.
    """
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, TorchDynamoPlugin

    if strategy == "fsdp":
        acc_state = AcceleratorState(dynamo_plugin=TorchDynamoPlugin(), _from_accelerator=True)
        plugin = _cpu_fsdp_plugin()
        if acc_state._mixed_precision != "no":
            plugin.set_mixed_precision(acc_state._mixed_precision)
        acc_state.fsdp_plugin = plugin
        kind = DistributedType.FSDP
    else:
        # `cpu=False` takes accelerate's DeepSpeed branch; the plugin is the one the training arguments
        # made and registered for ZeRO-3 init, handed over so the trainer's Accelerator reuses it.
        acc_state = AcceleratorState(
            cpu=False,
            dynamo_plugin=TorchDynamoPlugin(),
            deepspeed_plugin=config.deepspeed_plugin,
            _from_accelerator=True,
        )
        config.deepspeed_plugin = None
        kind = DistributedType.DEEPSPEED
    # Both are singletons, and every later AcceleratorState() copies PartialState's fields over its own.
    acc_state.distributed_type = kind
    PartialState().distributed_type = kind
    if kind == DistributedType.FSDP and acc_state.fsdp_plugin.fsdp_version == 1:
        import torch

        # FSDP1 checks that the `device_id` accelerate passes (the state's device, `cpu:0`) is the
        # compute device it derives for CPU modules, `cpu`; the same memory either way.
        acc_state.device = PartialState().device = torch.device("cpu")
    precision = ""
    if kind == DistributedType.FSDP:
        # What FSDP's mixed-precision policy gathers the parameters in for compute (None: their own dtype).
        dtype = getattr(acc_state.fsdp_plugin.mixed_precision_policy, "param_dtype", None)
        precision = f"; FSDP computes in {str(dtype).removeprefix('torch.') if dtype else 'the load dtype'}"
    log.info(
        "CPU launch: engaged %s in accelerate's state (accelerate alone would run DDP)%s", strategy, precision
    )
    return True


def _cpu_fsdp_plugin() -> Any:
    """accelerate's FSDP plugin from the launch's FSDP_* variables, made to work on the CPU.

    FSDP1's `sync_module_states` (how rank 0's weights reach the ranks that built on `meta`) is refused
    twice on CPU: accelerate wants an accelerator to materialise parameters on, and torch refuses CPU
    tensors because NCCL cannot broadcast them. gloo can, so on this CPU path both are let through.
    """
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin

    if os.environ.get("FSDP_VERSION", "1") == "2":
        return FullyShardedDataParallelPlugin()
    ram_efficient = _env_flag("FSDP_CPU_RAM_EFFICIENT_LOADING")
    sync = ram_efficient or _env_flag("FSDP_SYNC_MODULE_STATES")
    plugin = FullyShardedDataParallelPlugin(sync_module_states=False, cpu_ram_efficient_loading=False)
    if sync:
        import torch.distributed.fsdp._init_utils as fsdp_init

        cpu = torch.device("cpu")
        plugin.sync_module_states = True
        plugin.cpu_ram_efficient_loading = ram_efficient
        plugin.param_init_fn = lambda module: module.to_empty(device=cpu, recurse=False)
        fsdp_init._check_module_states_for_sync_module_states = lambda module_states: None
    # The trainer's Accelerator parses these again (its plugin is then dropped for this one) and would
    # refuse them on CPU as above.
    os.environ["FSDP_SYNC_MODULE_STATES"] = "false"
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "false"
    return plugin


def _quiet_progress_bars(heavy: bool) -> None:
    """train.log is read by people and tailed by the service: no carriage-return progress bars in it."""
    if heavy:
        import transformers

        transformers.utils.logging.disable_progress_bar()
    else:
        import datasets

        datasets.disable_progress_bars()


def _strategy(state: Any) -> str:
    """What `accelerate launch` set up. PartialState does not know FSDP or DeepSpeed (the Accelerator
    the trainer builds later reads them from the same environment variables), so read those here."""
    import os

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        return "fsdp"
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        return "deepspeed"
    return "ddp" if state.num_processes > 1 else "none"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() in ("true", "1", "yes")


def _deepspeed_from_env() -> bool:
    import os

    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def _zero3_from_env() -> bool:
    import os

    return _deepspeed_from_env() and os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3"
