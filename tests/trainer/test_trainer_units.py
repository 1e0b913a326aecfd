"""Pure parts of the trainer: the article-flag mapping, the metrics writer, dataset loading rules."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from trainer_helpers import Tiny

from ftq.spec import DatasetSpec
from trainer.args import parse_args
from trainer.callbacks import POINT_FIELDS, MetricsWriter, read_points
from trainer.data import load_splits
from trainer.errors import DatasetError

FALCON_FLAGS = (
    "--model_name ./falcon --dataset_name chat.jsonl --max_seq_len 2048 --max_steps 5000 "
    "--logging_steps 25 --eval_steps 1000 --save_steps 100 --packing True --output_dir ./out "
    "--per_device_train_batch_size 1 --gradient_accumulation_steps 1 --dataset_text_field content "
    "--lr_scheduler_type cosine --weight_decay 0.01 --warmup_ratio 0.03 --use_flash_attn True "
    "--use_gradient_checkpointing True --use_peft_lora True --lora_r 16 --lora_alpha 32 --lora_dropout 0.1 "
    "--lora_target_modules query_key_value,dense,dense_h_to_4h,dense_4h_to_h"
)


def test_falcon_article_flags_map_onto_one_job_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "ACCELERATE_USE_FSDP"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    args = parse_args(FALCON_FLAGS.split())
    spec = args.spec
    assert args.from_article_flags and args.output_dir == Path("./out")
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


def test_llama_article_flags_full_finetune_under_fsdp(monkeypatch: pytest.MonkeyPatch) -> None:
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


def _state(step: int, tokens: int, main: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        global_step=step,
        epoch=step / 10,
        max_steps=40,
        num_input_tokens_seen=tokens,
        is_world_process_zero=main,
    )


def test_metrics_writer_writes_points_with_nulls_for_what_was_not_logged(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    w = MetricsWriter(path)
    w.on_step_begin(None, _state(0, 0), None)
    w.on_log(
        None, _state(2, 1000), None, logs={"loss": 2.5, "learning_rate": 1e-4, "grad_norm": 0.7, "epoch": 0.2}
    )
    w.on_log(None, _state(2, 1000), None, logs={"eval_loss": 2.4, "eval_runtime": 1.0, "epoch": 0.2})
    w.on_log(
        None, _state(3, 1500), None, logs={"loss": float("nan"), "learning_rate": 1e-4, "grad_norm": math.inf}
    )
    w.on_log(
        None, _state(3, 1500), None, logs={"train_runtime": 9.0, "train_loss": 2.4}
    )  # summary: not a Point
    w.on_log(None, _state(4, 2000, main=False), None, logs={"loss": 2.0})  # another rank: writes nothing
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    train, evaluation, nan_point = (json.loads(line) for line in lines)
    assert set(POINT_FIELDS) | {"max_steps"} == set(train)
    assert (
        train["step"] == 2
        and train["loss"] == 2.5
        and train["eval_loss"] is None
        and train["max_steps"] == 40
    )
    assert train["tokens_per_second"] is not None and train["tokens_per_second"] > 0
    assert (
        evaluation["eval_loss"] == 2.4 and evaluation["loss"] is None and evaluation["learning_rate"] is None
    )
    assert nan_point["loss"] is None and nan_point["grad_norm"] is None  # JSON has no NaN
    assert read_points(path) == [train, evaluation, nan_point]


def test_single_file_eval_split_is_a_deterministic_holdout(tiny: Tiny) -> None:
    spec = DatasetSpec(name_or_path=str(tiny.data / "train.jsonl"), eval_split="eval")
    _, a = load_splits(spec, seed=7)
    _, b = load_splits(spec, seed=7)
    assert a.eval is not None and b.eval is not None
    assert len(a.eval) == 100 and len(a.train) == 1900  # 5% of 2000 rows
    assert a.eval["text"] == b.eval["text"]
    _, other = load_splits(spec, seed=8)
    assert other.eval is not None and other.eval["text"] != a.eval["text"]  # the seed decides, nothing else


def test_folder_of_files_names_splits_after_files_and_detects_messages(tiny: Tiny) -> None:
    _, text = load_splits(DatasetSpec(name_or_path=str(tiny.data), eval_split="eval"), seed=0)
    assert text.format == "text" and text.eval is not None and len(text.eval) == 64
    _, chat = load_splits(DatasetSpec(name_or_path=str(tiny.root / "chat"), eval_split="eval"), seed=0)
    assert chat.format == "messages" and chat.train.column_names == ["messages"]


def test_missing_eval_split_in_a_multi_split_dataset_lists_the_splits(tiny: Tiny) -> None:
    with pytest.raises(DatasetError, match=r"has no split 'validation' \(splits: .*eval.*train"):
        load_splits(DatasetSpec(name_or_path=str(tiny.data), eval_split="validation"), seed=0)
