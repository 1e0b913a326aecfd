"""Activation checkpointing as the model really runs it (trainer/train.py `checkpointing_args`): LoRA
under DeepSpeed ZeRO-3, the Falcon job's setup, trains with reentrant checkpointing on two real CPU
processes (the launch in conftest.py `zero3_lora_run`, whose samples test_samples.py reads)."""

from __future__ import annotations

import math

import pytest

from tests.integration.trainer.helpers import Run, points

pytestmark = pytest.mark.slow


def test_lora_under_zero3_trains_with_reentrant_checkpointing(zero3_lora_run: Run) -> None:
    from safetensors.torch import load_file

    out, log = zero3_lora_run.out, zero3_lora_run.log
    # Read off the checkpoint function transformers gave the layers, not off a flag.
    assert "activation checkpointing: reentrant" in log, log[-6000:]

    losses = [p["loss"] for p in points(out) if p["loss"] is not None]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    adapter = load_file(str(out / "final" / "adapter_model.safetensors"))
    lora_b = [t for k, t in adapter.items() if "lora_B" in k]
    assert len(lora_b) == 8 and all(float(t.abs().sum()) > 0 for t in lora_b)  # gradients reached them
