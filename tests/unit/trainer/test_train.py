"""The SFTConfig the trainer builds from a job spec (trainer/train.py `sft_config`), in the launch
environment `accelerate launch` sets: what transformers and TRL will read from it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftq.contract.spec import JobSpec
from trainer.train import sft_config


def job(lora: bool, packing: bool = True) -> JobSpec:
    spec: dict[str, Any] = {
        "model": {"name_or_path": "/models/m"},
        "dataset": {"name_or_path": "/data/train.jsonl"},
        "training": {
            "max_steps": 1,
            "gradient_checkpointing": True,
            "packing": packing,
            "mixed_precision": "no",
        },
        "resources": {"device": "cpu"},
    }
    if lora:
        spec["lora"] = {"r": 8}
    return JobSpec.model_validate(spec)


@pytest.fixture
def zero3_launch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The variables `accelerate launch` sets for a ZeRO-3 config; DeepSpeed's global config that the
    training arguments register is dropped afterwards, so later tests build ordinary models."""
    from accelerate.state import AcceleratorState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    yield
    unset_hf_deepspeed_config()
    AcceleratorState._reset_state(reset_partial_state=True)


def test_lora_under_zero3_checkpoints_reentrant_in_the_field_transformers_reads(
    zero3_launch: None, tmp_path: Path
) -> None:
    config = sft_config(job(lora=True), tmp_path, has_eval=False)
    assert config.deepspeed_plugin is not None and config.deepspeed_plugin.zero_stage == 3
    assert config.activation_checkpointing is True
    # transformers' Trainer hands activation_checkpointing_kwargs to the model; TRL's PEFT + ZeRO-3 guard
    # writes into the deprecated alias, which must be the same dict for its write to count.
    assert config.activation_checkpointing_kwargs == {"use_reentrant": True}
    assert config.gradient_checkpointing_kwargs is config.activation_checkpointing_kwargs


def test_full_finetune_under_zero3_checkpoints_non_reentrant(zero3_launch: None, tmp_path: Path) -> None:
    config = sft_config(job(lora=False), tmp_path, has_eval=False)
    assert config.activation_checkpointing_kwargs == {"use_reentrant": False}


def test_lora_without_deepspeed_checkpoints_non_reentrant(tmp_path: Path) -> None:
    config = sft_config(job(lora=True), tmp_path, has_eval=False)
    assert config.activation_checkpointing_kwargs == {"use_reentrant": False}


def test_padding_free_packing_counts_every_token(tmp_path: Path) -> None:
    # Padding-free batches have no mask: "non_padding" would compare ids with the pad id, which is EOS
    # on Llama tokenizers, and miss each document's EOS.
    assert sft_config(job(lora=False), tmp_path, has_eval=False).include_num_input_tokens_seen == "all"
    padded = sft_config(job(lora=False, packing=False), tmp_path, has_eval=False)
    assert padded.include_num_input_tokens_seen == "non_padding"


def test_the_plans_process_group_timeout_becomes_ddp_timeout_never_under_30_minutes(tmp_path: Path) -> None:
    # ddp_timeout is what TrainingArguments hands accelerate's PartialState for init_process_group.
    assert sft_config(job(lora=False), tmp_path, has_eval=False).ddp_timeout == 1800
    config = sft_config(job(lora=False), tmp_path, has_eval=False, process_group_timeout=2760)
    assert config.ddp_timeout == 2760
    assert sft_config(job(lora=False), tmp_path, has_eval=False, process_group_timeout=60).ddp_timeout == 1800


def test_rank_0_alone_reports_progress_and_a_failed_write_never_ends_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ftq.contract import progress, runs
    from trainer.train import report_progress

    monkeypatch.setenv("RANK", "1")
    report_progress(tmp_path, progress.RunPhase.loading, progress.LOADING_INPUTS)
    assert not (tmp_path / runs.PROGRESS).exists()
    monkeypatch.setenv("RANK", "0")
    report_progress(tmp_path, progress.RunPhase.saving, progress.SAVING_FINAL, step=4, max_steps=4)
    rec = progress.latest(tmp_path / runs.PROGRESS)
    assert rec is not None and (rec.phase, rec.message, rec.step, rec.max_steps) == (
        "saving",
        "saving the final model",
        4,
        4,
    )
    report_progress(tmp_path / "gone", progress.RunPhase.loading, progress.RESUMING)  # no such folder
    assert "could not write progress.jsonl" in caplog.text
