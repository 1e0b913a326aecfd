"""Activation checkpointing as the model really runs it (trainer/train.py `checkpointing_args`): LoRA
under DeepSpeed ZeRO-3, the Falcon job's setup, trains with reentrant checkpointing on two real CPU
processes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.integration.trainer.helpers import (
    ACCELERATE_ZERO3_CPU,
    explain,
    launch_trainer,
    points,
    write_spec,
)

pytestmark = pytest.mark.slow


def test_lora_under_zero3_trains_with_reentrant_checkpointing(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "run"
    spec = {
        "model": {"name_or_path": str(tiny_dir / "model")},
        "dataset": {"name_or_path": str(tiny_dir / "data" / "train.jsonl")},
        "training": {
            "max_seq_len": 128,
            "max_steps": 4,
            "per_device_train_batch_size": 2,
            "learning_rate": 5e-3,
            "logging_steps": 1,
            "packing": True,
            "gradient_checkpointing": True,
            "mixed_precision": "no",
            "seed": 4,
        },
        "lora": {
            "r": 8,
            "alpha": 16,
            "dropout": 0.0,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        },
        "distributed": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}},
        "resources": {"device": "cpu", "processes_per_node": 2},
    }
    proc = launch_trainer(
        ACCELERATE_ZERO3_CPU,
        tmp_path,
        ["--spec", str(write_spec(tmp_path / "spec.json", spec)), "--output_dir", str(out)],
    )
    assert proc.returncode == 0, explain(proc)
    assert "engaged deepspeed" in proc.stderr
    # Read off the checkpoint function transformers gave the layers, not off a flag.
    assert "activation checkpointing: reentrant" in proc.stderr, explain(proc)

    losses = [p["loss"] for p in points(out) if p["loss"] is not None]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    adapter = load_file(str(out / "final" / "adapter_model.safetensors"))
    lora_b = [t for k, t in adapter.items() if "lora_B" in k]
    assert len(lora_b) == 8 and all(float(t.abs().sum()) > 0 for t in lora_b)  # gradients reached them
