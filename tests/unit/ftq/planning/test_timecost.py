"""The time and cost estimate every plan carries (ftq/planning/timecost.py): tokens over a measured throughput
where the operator set one, else tokens x FLOPs per token per parameter x parameters over the devices'
peak FLOP/s x the assumed utilisation."""

from __future__ import annotations

from typing import Any

import pytest

from ftq.contract.spec import JobSpec
from ftq.planning.timecost import time_estimate
from ftq.runtime.settings import Settings


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
    assert te.reason is not None and "token count" in te.reason
    te = time_estimate(epochs, s, parameters=10, run_tokens=10_000)
    assert te.tokens == 10_000 and te.seconds == pytest.approx(6 * 10_000 * 10 / (8 * 312e12 * 0.35))
    assert te.reason is None
    te = time_estimate(spec(), Settings(gpu_type="Z9000"), parameters=10)
    assert te.seconds is None and any("Z9000" in a for a in te.assumptions)
    assert te.reason is not None and "Z9000" in te.reason
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


def test_a_measured_throughput_decides_the_time_where_the_operator_set_one() -> None:
    # The same spec on hardware the operator measured: tokens / (tokens/s per device x devices), whatever
    # the FLOPs arithmetic would say; without a parameter count too, since the throughput needs none.
    s = Settings(gpu_type="H100", tokens_per_second_per_device=2000.0)
    te = time_estimate(spec(), s, parameters=None)
    tokens = 100 * 4 * 2 * 8 * 1024
    assert te.tokens == tokens and te.tokens_per_second_per_device == 2000.0
    assert te.seconds == pytest.approx(tokens / (2000.0 * 8))
    assert any("FTQ_TOKENS_PER_SECOND_PER_DEVICE" in a for a in te.assumptions)
    assert not any("FTQ_ASSUMED_MFU" in a for a in te.assumptions)
    flops_based = time_estimate(spec(), Settings(gpu_type="H100"), parameters=7_000_000_000)
    assert flops_based.tokens_per_second_per_device is None and flops_based.seconds != te.seconds


def test_the_dataset_preflight_token_count_replaces_the_full_length_upper_bound() -> None:
    # max_steps without packing: every sequence max_seq_len long is an upper bound; the preflight's
    # count at the data's mean length is what the run trains on.
    s = Settings(tokens_per_second_per_device=1000.0)
    bound = time_estimate(spec(), s, parameters=None)
    counted = time_estimate(spec(), s, parameters=None, run_tokens=12_345)
    assert bound.tokens == 100 * 4 * 2 * 8 * 1024 and counted.tokens == 12_345
    assert counted.seconds == pytest.approx(12_345 / 8000)
    assert any("dataset preflight" in a for a in counted.assumptions)
