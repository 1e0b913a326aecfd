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
        # A local model: no fetch step to count (fetch_seconds is tested on its own).
        "model": {"name_or_path": "/models/model"},
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
    # comm_overlap 1: the collectives hidden behind compute, so the seconds are the FLOPs term alone.
    s = Settings(gpu_type="H100", assumed_mfu=0.5, price_per_device_hour=2.0, comm_overlap=1.0)
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
    te = time_estimate(epochs, Settings(comm_overlap=1.0), parameters=10, run_tokens=10_000)
    assert te.tokens == 10_000 and te.seconds == pytest.approx(6 * 10_000 * 10 / (8 * 989e12 * 0.35))
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


# Issue 27 (8): the collectives' term ----------


def test_fsdp_and_zero3_pay_for_their_gathers_over_the_interconnect() -> None:
    s = Settings(gpu_type="A100", intra_node_gbps=100.0, inter_node_gbps=25.0, comm_overlap=0.25)
    params = 7_000_000_000
    one_node = time_estimate(spec(), s, parameters=params)
    # 100 steps x 2 micro-batches; 2 gathers + 1 reduce-scatter of 7e9 bf16 values; 7/8 over 100 GB/s.
    per_pass = 3 * params * 2 * 7 / 8 / 100e9
    assert one_node.communication_seconds == pytest.approx(200 * per_pass * 0.75)
    compute = time_estimate(spec(), Settings(gpu_type="A100", comm_overlap=1.0), parameters=params).seconds
    assert compute is not None
    assert compute == pytest.approx(6 * 100 * 4 * 2 * 8 * 1024 * params / (8 * 312e12 * 0.35))
    assert one_node.seconds == pytest.approx(compute + 200 * per_pass * 0.75)
    assert any("FTQ_INTRA_NODE_GBPS" in a and "FTQ_COMM_OVERLAP" in a for a in one_node.assumptions)
    # Across nodes the node's network is the slow link (and 15/16 of the bytes cross it).
    two = spec(resources={"device": "cuda", "processes_per_node": 8, "num_nodes": 2, "launcher": "slurm"})
    te = time_estimate(two, s, parameters=params)
    two_pass = 3 * params * 2 * 15 / 16 / 25e9
    assert te.communication_seconds == pytest.approx(200 * two_pass * 0.75)
    assert any("FTQ_INTER_NODE_GBPS" in a for a in te.assumptions)
    # SHARD_GRAD_OP keeps the weights after the forward: one gather fewer.
    grad_op = spec(distributed={"strategy": "fsdp", "fsdp": {"reshard_after_forward": False}})
    te = time_estimate(grad_op, s, parameters=params)
    assert te.communication_seconds == pytest.approx(200 * 2 * params * 2 * 7 / 8 / 100e9 * 0.75)
    # LoRA under ZeRO-3: the frozen base is gathered twice, only the adapters' gradients reduced.
    lora = spec(
        distributed={"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}},
        lora={"r": 16, "alpha": 32, "target_modules": ["q_proj"]},
    )
    te = time_estimate(lora, s, parameters=params, trainable=1_000_000)
    assert te.communication_seconds == pytest.approx(
        200 * (2 * params + 1_000_000) * 2 * 7 / 8 / 100e9 * 0.75
    )


def test_no_communication_term_where_there_is_none_or_it_was_measured() -> None:
    one = spec(resources={"device": "cuda", "processes_per_node": 1}, distributed={"strategy": "none"})
    assert time_estimate(one, Settings(), parameters=10**9).communication_seconds is None
    cpu = spec(resources={"device": "cpu", "processes_per_node": 2})
    assert time_estimate(cpu, Settings(), parameters=10**9).communication_seconds is None
    measured = time_estimate(spec(), Settings(tokens_per_second_per_device=1000.0), parameters=10**9)
    assert measured.communication_seconds is None


def test_the_article_jobs_estimates_move_toward_their_reported_hours() -> None:
    """Llama 2 70B FSDP (article: 13.5 h) and Falcon 180B LoRA ZeRO-3 (36 h), on the articles' 2 x 8 A100
    (the settings of that era: NVLink 3 at 150 GB/s, 50 GB/s across nodes)."""
    from tests.unit.ftq.planning.test_render import golden_plan

    a100 = {"gpu_type": "A100", "intra_node_gbps": 150.0, "inter_node_gbps": 50.0}
    llama = golden_plan("llama2-70b-fsdp", **a100).time_estimate
    falcon = golden_plan("falcon-180b-lora-zero3", **a100).time_estimate
    assert llama is not None and falcon is not None
    assert llama.seconds is not None and falcon.seconds is not None
    # A 70B full fine-tune does not fit one node's 8 GPUs: sharded over all 16, gathers cross the nodes.
    assert llama.communication_seconds == pytest.approx(0.54 * 3600, rel=0.02)
    # 1.44 h of weights' FLOPs + 0.06 h of attention at 2,048 tokens + 0.54 h + the 138 GB hub download
    # inside the allocation (0.15 h at 0.25 GB/s); was 1.98 h.
    assert llama.seconds / 3600 == pytest.approx(2.19, rel=0.02)
    # Falcon's LoRA gathers its frozen base from ZeRO++ hpZ's copy within each node: 9.31 h of exposed
    # communication becomes 2.9 h, and 37.2 h becomes 32.2 h (with its 357 GB download, 0.40 h).
    assert falcon.communication_seconds == pytest.approx(2.9 * 3600, rel=0.02)
    assert falcon.seconds / 3600 == pytest.approx(32.2, rel=0.02)
