"""What the trainer sets up for sharded and long runs (issue 51): the load dtype of FSDP2 LoRA, a continued
adapter's dtype under ZeRO-3, GRPO's lockstep generation and prompt truncation, and the process group's
timeout once the model is loaded (with NCCL's dump on timeout)."""

from __future__ import annotations

import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ftq.contract.spec import JobSpec
from tests.harness import tiny_spec
from trainer import train
from trainer.model import load_adapter, load_dtype


def job(tiny_dir: Path, *, lora: bool = True, mixed_precision: str = "bf16") -> JobSpec:
    spec = tiny_spec(tiny_dir, processes=2, mixed_precision=mixed_precision)
    spec["distributed"] = {"strategy": "fsdp", "fsdp": {"version": 2}}
    if mixed_precision == "fp16":
        spec["resources"]["device"] = "cuda"
    if not lora:
        spec.pop("lora")
    return JobSpec.model_validate(spec)


def test_fsdp2_lora_loads_the_frozen_base_in_the_compute_dtype(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setenv("FSDP_VERSION", "2")
    assert load_dtype(job(tiny_dir), "fsdp") == torch.bfloat16
    assert load_dtype(job(tiny_dir, mixed_precision="fp16"), "fsdp") == torch.float16
    # Full fine-tuning keeps float32 master weights; so does `mixed_precision: no`, and FSDP1, whose flat
    # parameters hold one dtype for the frozen base and the adapter alike.
    assert load_dtype(job(tiny_dir, lora=False), "fsdp") == torch.float32
    assert load_dtype(job(tiny_dir, mixed_precision="no"), "fsdp") == torch.float32
    monkeypatch.setenv("FSDP_VERSION", "1")
    assert load_dtype(job(tiny_dir), "fsdp") == torch.float32


def test_a_continued_adapter_keeps_the_base_dtype_under_zero3(tiny_dir: Path, tmp_path: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    def base() -> Any:
        return AutoModelForCausalLM.from_pretrained(tiny_dir / "model", dtype=torch.bfloat16)

    get_peft_model(base(), LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(
        str(tmp_path / "adapter")
    )
    dtypes = {
        keep: {
            p.dtype
            for p in load_adapter(base(), str(tmp_path / "adapter"), keep_model_dtype=keep).parameters()
            if p.requires_grad
        }
        for keep in (False, True)
    }
    # PEFT's default upcasts the adapter (ZeRO-3's coalesced all-gather then fails on the mixed dtypes);
    # under ZeRO-3 it stays in the base's bf16, as TRL makes the adapters it creates there.
    assert dtypes == {False: {torch.float32}, True: {torch.bfloat16}}


def fake_grpo_trainer(model: Any, continuous: bool = False) -> Any:
    args = SimpleNamespace(use_transformers_continuous_batching=continuous)
    return SimpleNamespace(model=model, args=args, use_transformers_continuous_batching=continuous)


def test_grpo_generates_in_lockstep_wherever_the_weights_are_sharded(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from transformers.distributed.fsdp import is_fsdp_managed_module

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_dir / "model"), LoraConfig(r=4, target_modules=["q_proj"])
    )
    generating = model.get_base_model()  # what PeftModel.generate calls generate() on
    assert not is_fsdp_managed_module(generating)
    assert not train.generate_in_lockstep(fake_grpo_trainer(model), "fsdp", processes=1)
    assert not train.generate_in_lockstep(fake_grpo_trainer(model), "ddp", processes=2)
    trainer = fake_grpo_trainer(model, continuous=True)
    assert train.generate_in_lockstep(trainer, "fsdp", processes=2)
    # transformers then decides synced_gpus=True on more than one process, whatever torch annotated.
    assert is_fsdp_managed_module(generating)
    # Continuous batching ignores synced_gpus: off.
    assert (
        not trainer.args.use_transformers_continuous_batching
        and not trainer.use_transformers_continuous_batching
    )
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    assert not train.generate_in_lockstep(fake_grpo_trainer(model), "deepspeed", processes=2)
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    assert train.generate_in_lockstep(fake_grpo_trainer(model, continuous=True), "deepspeed", processes=2)


def test_grpo_prompts_over_max_seq_len_keep_their_last_tokens() -> None:
    seen: list[list[Any]] = []

    def tokenize(prompts: list[Any]) -> tuple[list[list[int]], None, dict[str, Any]]:
        seen.append(prompts)
        return [list(range(n)) for n in prompts], None, {}

    trainer = SimpleNamespace(_tokenize_prompts=tokenize)
    train.truncate_prompts(trainer, 4)
    ids, images, fields = trainer._tokenize_prompts([2, 4, 7])
    assert ids == [[0, 1], [0, 1, 2, 3], [3, 4, 5, 6]] and images is None and fields == {}
    assert seen == [[2, 4, 7]]


def test_the_process_group_timeout_comes_down_once_the_model_is_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    set_to: list[datetime.timedelta] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 16)
    monkeypatch.setattr(c10d, "_set_pg_timeout", lambda timeout, group=None: set_to.append(timeout))
    # 180B at the plan's load bandwidth: 2 h for the first collective, 30 min from the first step.
    assert train.lower_process_group_timeout(7200.0)
    assert set_to == [datetime.timedelta(seconds=1800)]
    assert not train.lower_process_group_timeout(1800.0)  # already the run's: nothing to lower
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)
    assert not train.lower_process_group_timeout(7200.0)
    assert len(set_to) == 1


def test_train_begin_lowers_the_timeout_from_the_arguments_ddp_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[float] = []
    monkeypatch.setattr(train, "lower_process_group_timeout", lambda loading_s: asked.append(loading_s))
    train.train_begin_callback().on_train_begin(SimpleNamespace(ddp_timeout=7200), None, None, model=None)
    assert asked == [7200.0]


def test_nccl_dumps_its_flight_recorder_into_the_run_directory_on_a_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    names = ("TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
    for name in (*names, "TORCH_FR_DUMP_TEMP_FILE"):
        monkeypatch.delenv(name, raising=False)
    train.nccl_dump_on_timeout(tmp_path)
    assert os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    # torch's current name: the deprecated one prints a warning at the top of every rank's log.
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == "2000" and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ
    assert os.environ["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "nccl_trace_rank_")
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE")
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "500")  # the operator's value wins, by either name
    train.nccl_dump_on_timeout(tmp_path)
    assert "TORCH_FR_BUFFER_SIZE" not in os.environ


def test_the_plans_sync_each_batch_reaches_the_training_arguments(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FTQ_SYNC_EACH_BATCH=1 (the plan's, for FSDP full fine-tuning with gradient accumulation) becomes
    accelerate's GradientAccumulationPlugin sync_each_batch: no micro-batch under no_sync, so FSDP2 keeps
    no full-size gradients between them. Without it, transformers' default."""
    spec = job(tiny_dir, lora=False, mixed_precision="no")
    monkeypatch.delenv(train.SYNC_EACH_BATCH_ENV, raising=False)
    plain = train.training_config(spec, tmp_path / "a", has_eval=False)
    assert not (plain.accelerator_config.gradient_accumulation_kwargs or {}).get("sync_each_batch")
    monkeypatch.setenv(train.SYNC_EACH_BATCH_ENV, "1")
    synced = train.training_config(spec, tmp_path / "b", has_eval=False)
    assert synced.accelerator_config.gradient_accumulation_kwargs == {"sync_each_batch": True}


def test_the_plans_hpz_partition_size_reaches_the_deepspeed_config(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FTQ_ZERO_HPZ_PARTITION_SIZE (the plan's ZeRO++ hpZ for multi-node ZeRO-3) is written into the
    DeepSpeed config the training arguments made from the launch's ACCELERATE_DEEPSPEED_* variables: the
    plugin's, which the Trainer's Accelerator hands DeepSpeed, and the copy ZeRO-3 init reads."""
    from transformers.integrations.deepspeed import deepspeed_config, unset_hf_deepspeed_config

    body = tiny_spec(tiny_dir, processes=2)
    body["distributed"] = {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}}
    spec = JobSpec.model_validate(body)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    monkeypatch.delenv(train.ZERO_HPZ_ENV, raising=False)
    try:
        plain = train.training_config(spec, tmp_path / "a", has_eval=False)
        assert "zero_hpz_partition_size" not in plain.deepspeed_plugin.deepspeed_config["zero_optimization"]
        monkeypatch.setenv(train.ZERO_HPZ_ENV, "8")
        config = train.training_config(spec, tmp_path / "b", has_eval=False)
        assert config.deepspeed_plugin.deepspeed_config["zero_optimization"]["zero_hpz_partition_size"] == 8
        assert deepspeed_config()["zero_optimization"]["zero_hpz_partition_size"] == 8
        # DeepSpeed's own config model takes it as ZeRO++'s secondary partition.
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        zero = DeepSpeedZeroConfig(**config.deepspeed_plugin.deepspeed_config["zero_optimization"])
        assert zero.zero_hpz_partition_size == 8
        # No DeepSpeed launch (FSDP, DDP): nothing to write, whatever the environment says.
        monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "false")
        assert train.apply_zero_hpz(SimpleNamespace(deepspeed_plugin=None)) is None
    finally:
        unset_hf_deepspeed_config()
