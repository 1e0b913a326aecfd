"""GRPO in the plan's estimates (ftq/planning/estimate.py `_generation_bytes`, `_reference_bytes`;
ftq/planning/timecost.py `generation_terms`): the KV cache of the completions a process samples, the
reference model only when beta > 0, and the generation's forward passes in the time."""

from __future__ import annotations

from typing import Any

from ftq.planning.estimate import estimate_memory, parse_arch
from ftq.planning.timecost import flops_factor, generation_terms, time_estimate
from ftq.runtime.settings import Settings
from tests.unit.ftq.planning.test_estimate import A100, LLAMA, config, example

GRADER = {"type": "string_check", "input": "{{sample.output_text}}", "reference": "x", "operation": "eq"}


def grpo(**changes: Any) -> Any:
    """The Llama 2 70B FSDP example (16 processes) as a full fine-tuning GRPO job, 2 sequences a device."""
    base: dict[str, Any] = {
        "lora": None,
        "training__packing": False,
        "dataset__format": "auto",
        "training__method": "grpo",
        "training__per_device_train_batch_size": 2,
        "training__grader": GRADER,
        "training__grpo": {"num_generations": 8, "max_completion_length": 1024},
    }
    return example("llama2-70b-fsdp", **{**base, **changes})


def test_the_kv_cache_of_the_generation_batch_is_counted() -> None:
    llama = config(LLAMA)
    arch = parse_arch(llama)
    assert arch is not None
    spec = grpo()
    est = estimate_memory(spec, llama, device_memory_bytes=A100)
    # The trainer keeps a prompt's last max_seq_len tokens; its completion (up to 1,024) comes on top.
    seq = spec.training.max_seq_len + 1024
    # 2 sequences a process, keys and values of 80 layers x 8 kv heads x 128 dims, bf16; plus the logits row.
    kv = 2 * arch.layers * arch.kv_heads * arch.head_dim * seq * 2 * 2 + 2 * arch.vocab * 4
    assert est.breakdown["generation_kv_cache"] == kv
    # steps_per_generation 4: each process samples 4 micro-batches' completions at once.
    four = estimate_memory(
        grpo(training__grpo={"num_generations": 8, "max_completion_length": 1024, "steps_per_generation": 4}),
        llama,
        device_memory_bytes=A100,
    )
    assert four.breakdown["generation_kv_cache"] == 4 * kv
    assert four.per_device_bytes is not None and est.per_device_bytes is not None
    assert four.per_device_bytes > est.per_device_bytes
    sft = estimate_memory(
        example("llama2-70b-fsdp", lora=None, training__packing=False, dataset__format="auto"),
        llama,
        device_memory_bytes=A100,
    )
    assert "generation_kv_cache" not in sft.breakdown


def test_the_reference_model_only_with_beta_above_zero_and_full_fine_tuning() -> None:
    llama = config(LLAMA)
    total = parse_arch(llama).num_params  # type: ignore[union-attr]
    assert "reference_model" not in estimate_memory(grpo(), llama, device_memory_bytes=A100).breakdown
    kl = grpo(training__grpo={"num_generations": 8, "beta": 0.04})
    kl_est = estimate_memory(kl, llama, device_memory_bytes=A100)
    assert kl_est.breakdown["reference_model"] == total * 4 // 16  # FSDP: fp32, sharded over 16
    lora = grpo(training__grpo={"num_generations": 8, "beta": 0.04}, lora={"r": 16})
    assert "reference_model" not in estimate_memory(lora, llama, device_memory_bytes=A100).breakdown


def test_the_time_counts_one_forward_per_generated_token() -> None:
    settings = Settings(_env_file=None)
    spec = grpo(training__max_steps=10)
    generated, extra, note = generation_terms(spec)
    # 10 steps x 2 a device x 1 accumulation x 16 processes completions, of up to 1024 tokens each.
    assert generated == 10 * 2 * 16 * 1024 and extra == 0
    assert "2 FLOPs/token/parameter" in note
    params = 70_000_000_000
    base = time_estimate(example("llama2-70b-fsdp", training__max_steps=10), settings, parameters=params)
    est = time_estimate(spec, settings, parameters=params)
    assert est.flops is not None and est.tokens is not None
    factor = flops_factor(spec)[0]  # the training passes, as for any method
    assert est.flops == est.tokens * factor * params + generated * 2 * params
    assert any(a.startswith("generation:") for a in est.assumptions)
    assert not any(a.startswith("generation:") for a in base.assumptions)
    kl = grpo(training__max_steps=10, training__grpo={"num_generations": 8, "beta": 0.1, "num_iterations": 2})
    generated, extra, note = generation_terms(kl)
    assert extra == 4 and "reference" in note and "old policy" in note
    assert generated == 10 * 2 * 16 * 256 // 2  # the default max_completion_length, once per 2 iterations
