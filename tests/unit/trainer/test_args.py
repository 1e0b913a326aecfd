"""The trainer's command line (trainer/args.py): train.py's flags map onto one job spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.args import parse_args

FALCON_FLAGS = (
    "--model_name ./falcon --dataset_name chat.jsonl --max_seq_len 2048 --max_steps 5000 "
    "--logging_steps 25 --eval_steps 1000 --save_steps 100 --packing True --output_dir ./out "
    "--per_device_train_batch_size 1 --gradient_accumulation_steps 1 --dataset_text_field content "
    "--lr_scheduler_type cosine --weight_decay 0.01 --warmup_ratio 0.03 --use_flash_attn True "
    "--use_gradient_checkpointing True --use_peft_lora True --lora_r 16 --lora_alpha 32 --lora_dropout 0.1 "
    "--lora_target_modules query_key_value,dense,dense_h_to_4h,dense_4h_to_h"
)


def test_falcon_train_py_flags_map_onto_one_job_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "ACCELERATE_USE_FSDP"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    args = parse_args(FALCON_FLAGS.split())
    spec = args.spec
    assert args.from_train_py_flags and args.output_dir == Path("./out")
    assert spec.model.name_or_path == "./falcon" and spec.model.attn_implementation == "auto"
    assert (spec.dataset.format, spec.dataset.text_field, spec.dataset.eval_split) == (
        "text",
        "content",
        "test",
    )
    t = spec.training
    assert (t.max_seq_len, t.max_steps, t.num_train_epochs, t.logging_steps, t.eval_steps, t.save_steps) == (
        2048,
        5000,
        None,
        25,
        1000,
        100,
    )
    assert t.packing and t.gradient_checkpointing and t.mixed_precision == "no"  # --bf16 not given
    assert (t.lr_scheduler_type, t.weight_decay, t.warmup_ratio) == ("cosine", 0.01, 0.03)
    assert spec.lora is not None
    assert (spec.lora.r, spec.lora.alpha, spec.lora.dropout) == (16, 32, 0.1)
    assert spec.lora.target_modules == ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]
    assert spec.distributed.strategy == "deepspeed" and spec.distributed.deepspeed.zero_stage == 3


def test_llama_train_py_flags_full_finetune_under_fsdp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    args = parse_args(
        [
            "--model_name",
            "./llama",
            "--dataset_name",
            "./data",
            "--bf16",
            "True",
            "--use_flash_attn",
            "False",
            "--max_steps",
            "500",
            "--output_dir",
            "o",
        ]
    )
    spec = args.spec
    assert spec.lora is None and spec.training.mixed_precision == "bf16"
    assert spec.model.attn_implementation == "sdpa" and spec.dataset.format == "auto"
    assert spec.distributed.strategy == "fsdp" and spec.distributed.fsdp.version == 2
    assert (spec.resources.num_nodes, spec.resources.processes_per_node, spec.resources.launcher) == (
        2,
        8,
        "slurm",
    )


def test_the_process_group_timeout_flag_reaches_the_trainer_args(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(
        '{"model": {"name_or_path": "/models/m"}, "dataset": {"name_or_path": "/data/train.jsonl"}, '
        '"training": {"max_steps": 1}}'
    )
    base = ["--spec", str(spec), "--output_dir", str(tmp_path / "run")]
    assert parse_args(base).process_group_timeout is None
    assert parse_args([*base, "--process_group_timeout", "2760"]).process_group_timeout == 2760
