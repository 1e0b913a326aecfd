"""The time and cost estimate every plan carries (ftq/timecost.py): tokens x FLOPs per token per
parameter x parameters over the devices' peak FLOP/s x the assumed utilisation."""

from __future__ import annotations

from typing import Any

import pytest

from ftq.settings import Settings
from ftq.spec import JobSpec
from ftq.timecost import time_estimate


def spec(**over: Any) -> JobSpec:
    body: dict[str, Any] = {
        "model": {"name_or_path": "org/model"},
        "dataset": {"name_or_path": "org/data"},
        "training": {
            "max_steps": 100,
            "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 2,
            "max_seq_len": 1024,
        },
        "resources": {"device": "cuda", "processes_per_node": 8},
        "distributed": {"strategy": "fsdp"},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    return JobSpec.model_validate(body)


def test_full_fine_tuning_is_6_flops_per_token_per_parameter() -> None:
    s = Settings(gpu_type="H100", assumed_mfu=0.5, price_per_device_hour=2.0)
    te = time_estimate(spec(), s, parameters=7_000_000_000)
    tokens = 100 * 4 * 2 * 8 * 1024
    assert te.tokens == tokens
    assert te.flops == pytest.approx(6 * tokens * 7e9)
    assert te.seconds == pytest.approx(6 * tokens * 7e9 / (8 * 989e12 * 0.5), rel=1e-3)
    assert te.seconds is not None and te.device_hours is not None
    assert te.device_hours == pytest.approx(te.seconds / 3600 * 8, rel=1e-3)
    assert te.cost == pytest.approx(te.device_hours * 2.0, rel=1e-3)
    text = " ".join(te.assumptions)
    assert "989 TFLOP/s per H100" in text and "0.5 of peak" in text and "max_steps 100" in text


def test_lora_skips_the_frozen_weights_gradients_and_checkpointing_adds_a_forward() -> None:
    s = Settings()
    full = time_estimate(spec(), s, parameters=1_000_000)
    lora = time_estimate(spec(lora={"r": 8}), s, parameters=1_000_000)
    ckpt = time_estimate(
        spec(lora={"r": 8}, training={"gradient_checkpointing": True}), s, parameters=1_000_000
    )
    assert full.flops and lora.flops and ckpt.flops
    assert lora.flops / full.flops == pytest.approx(4 / 6)
    assert ckpt.flops / full.flops == pytest.approx(6 / 6)
    assert any("LoRA" in a and "no weight gradients" in a for a in lora.assumptions)
    assert lora.cost is None  # no price set


def test_what_cannot_be_known_is_said_not_guessed() -> None:
    s = Settings()
    te = time_estimate(spec(), s, parameters=None)
    assert te.seconds is None and te.tokens and any("parameters unknown" in a for a in te.assumptions)
    epochs = spec(training={"max_steps": None, "num_train_epochs": 2})
    te = time_estimate(epochs, s, parameters=10)
    assert te.tokens is None and te.seconds is None
    te = time_estimate(epochs, s, parameters=10, dataset_tokens=5000)
    assert te.tokens == 10_000 and te.seconds == pytest.approx(6 * 10_000 * 10 / (8 * 312e12 * 0.35))
    te = time_estimate(spec(), Settings(gpu_type="Z9000"), parameters=10)
    assert te.seconds is None and any("Z9000" in a for a in te.assumptions)
    cpu = time_estimate(
        spec(
            resources={"device": "cpu", "processes_per_node": 2},
            distributed={"strategy": "ddp"},
            training={"mixed_precision": "no"},
        ),
        Settings(cpu_peak_gflops=100, assumed_mfu=0.25),
        parameters=1000,
    )
    assert cpu.seconds == pytest.approx(6 * cpu.tokens * 1000 / (2 * 100e9 * 0.25), rel=1e-3)  # type: ignore[operator]
