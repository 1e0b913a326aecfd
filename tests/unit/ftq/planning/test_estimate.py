"""ftq.planning.estimate: the acceptance figures for the 70B and 180B example jobs from their config.json
alone, parameter counts checked against real (tiny) transformers models and PEFT, and the sanity of the
memory model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ftq.contract.spec import JobSpec
from ftq.planning.estimate import (
    USABLE_DEVICE_FRACTION,
    estimate_disk,
    estimate_memory,
    load_model_config,
    lora_params,
    parse_arch,
    suggest_alternatives,
    suggest_fix,
)
from tests.harness import EXAMPLES, MODEL_CONFIGS

FIXTURES = MODEL_CONFIGS
GiB = 1024**3
GB = 10**9
A100 = 80 * GiB


def example(name: str, **changes: Any) -> JobSpec:
    body = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = body
        for key in path:
            node = node.setdefault(key, {})
        node[last] = value
    return JobSpec.model_validate(body)


def config(name: str) -> dict[str, Any]:
    cfg, reason = load_model_config(str(FIXTURES / name))
    assert cfg is not None, reason
    return cfg


LLAMA = "llama-2-70b-hf"
FALCON = "falcon-180B"


def one_gpu(spec_name: str, **changes: Any) -> JobSpec:
    return example(
        spec_name,
        distributed__strategy="none",
        resources__launcher="local",
        resources__num_nodes=1,
        resources__processes_per_node=1,
        **changes,
    )


# Acceptance: the Llama 2 70B and Falcon 180B example jobs ----------


@pytest.mark.parametrize("name", ["llama2-70b-fsdp", "llama2-70b-fsdp1"])
def test_llama2_70b_full_finetune_over_16_gpus_fits_80gb(name: str) -> None:
    est = estimate_memory(example(name), config(LLAMA), device_memory_bytes=A100)
    assert est.per_device_bytes is not None and est.usable_device_bytes is not None
    assert 40 * GB <= est.per_device_bytes <= est.usable_device_bytes < A100
    assert est.fits is True
    assert est.world_size == 16
    assert est.trainable_parameters == est.num_parameters


def test_llama2_70b_full_finetune_on_one_gpu_does_not_fit() -> None:
    est = estimate_memory(one_gpu("llama2-70b-fsdp"), config(LLAMA), device_memory_bytes=A100)
    assert est.per_device_bytes is not None and est.num_parameters is not None
    assert est.per_device_bytes > 500 * GB
    assert est.fits is False
    # 16 bytes per parameter for weights, gradients and Adam, nothing sharded.
    b = est.breakdown
    assert b["params"] + b["grads"] + b["optimizer"] == 16 * est.num_parameters


def test_falcon_180b_lora_zero3_over_16_gpus_fits_80gb() -> None:
    est = estimate_memory(example("falcon-180b-lora-zero3"), config(FALCON), device_memory_bytes=A100)
    assert est.fits is True
    assert est.per_device_bytes is not None and est.num_parameters is not None
    assert est.trainable_parameters is not None
    # Two nodes: the estimate adds ZeRO++ hpZ's secondary copy (the 16-bit base over each node's 8 GPUs,
    # so the gathers stay on NVLink) because it still fits.
    assert est.parallelism is not None and est.parallelism.zero_hpz_partition_size == 8
    assert est.breakdown["hpz_secondary_params"] == pytest.approx(
        (est.num_parameters + est.trainable_parameters) * 2 / 8, rel=1e-6
    )
    assert est.per_device_bytes <= est.usable_device_bytes  # type: ignore[operator]
    without = estimate_memory(
        example("falcon-180b-lora-zero3", distributed__deepspeed__hpz_partition_size=1),
        config(FALCON),
        device_memory_bytes=A100,
    )
    assert without.parallelism is not None and without.parallelism.zero_hpz_partition_size is None
    assert without.per_device_bytes is not None and without.per_device_bytes < 80 * GB
    # The frozen base in bf16 is sharded 16 ways; it dominates the LoRA job's memory.
    assert (
        without.breakdown["params"]
        == est.breakdown["params"]
        == pytest.approx((est.num_parameters + est.trainable_parameters) * 2 / 16, rel=1e-6)
    )
    assert est.trainable_parameters < 0.002 * est.num_parameters


def test_parameter_counts_of_llama_2_70b_and_falcon_180b() -> None:
    llama = parse_arch(config(LLAMA))
    falcon = parse_arch(config(FALCON))
    assert llama is not None and falcon is not None
    assert llama.num_params == pytest.approx(69.0e9, rel=0.01)
    assert falcon.num_params == pytest.approx(179.5e9, rel=0.01)
    # Falcon 180B: new decoder architecture, 232 query heads sharing 8 key/value heads.
    assert falcon.linears[0].d_out == (232 + 2 * 8) * 64


# Parameter counts against real models ----------

# Mistral and Qwen2 on the same small grouped-query shapes (Qwen2's embeddings tied).
SMALL_GQA = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 200,
}
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-gqa": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 172,
        "num_hidden_layers": 3,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 301,
    },
    "llama-tied": {
        "model_type": "llama",
        "hidden_size": 48,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "tie_word_embeddings": True,
    },
    "mistral": {"model_type": "mistral", **SMALL_GQA},
    "qwen2": {"model_type": "qwen2", **SMALL_GQA, "tie_word_embeddings": True},
    "falcon-new": {
        "model_type": "falcon",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_kv_heads": 2,
        "new_decoder_architecture": True,
        "parallel_attn": True,
        "bias": False,
        "vocab_size": 150,
    },
    "falcon-7b-style": {
        "model_type": "falcon",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "multi_query": True,
        "new_decoder_architecture": False,
        "parallel_attn": True,
        "bias": False,
        "vocab_size": 150,
    },
    "gpt_neox": {
        "model_type": "gpt_neox",
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 120,
    },
    "gpt2": {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "vocab_size": 120,
        "n_positions": 32,
    },
}


def test_counts_match_real_models_and_peft() -> None:
    """The analytic counts equal what transformers builds from the same config, and the LoRA count equals
    PEFT's trainable parameters, target module by target module."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    for name, cfg in TINY_CONFIGS.items():
        hf_config = AutoConfig.for_model(**cfg)
        model = AutoModelForCausalLM.from_config(hf_config)
        real = sum(p.numel() for p in model.parameters())
        arch = parse_arch(cfg)
        assert arch is not None, name
        assert arch.num_params == real, name
        targets = [lin.name for lin in arch.linears][:2]
        for target_modules in (targets, "all-linear"):
            spec = example("falcon-180b-lora-zero3", lora__target_modules=target_modules, lora__r=4)
            assert spec.lora is not None
            peft_model = get_peft_model(
                AutoModelForCausalLM.from_config(hf_config),
                LoraConfig(r=4, lora_alpha=8, target_modules=target_modules, task_type="CAUSAL_LM"),
            )
            trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
            assert lora_params(arch, spec.lora) == trainable, (name, target_modules)


def test_known_public_model_sizes() -> None:
    mistral_7b = {
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
    }
    gpt2 = {
        "model_type": "gpt2",
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "vocab_size": 50257,
        "n_positions": 1024,
    }
    falcon_7b = {
        "model_type": "falcon",
        "hidden_size": 4544,
        "num_hidden_layers": 32,
        "num_attention_heads": 71,
        "multi_query": True,
        "parallel_attn": True,
        "bias": False,
        "vocab_size": 65024,
    }
    for cfg, size in ((mistral_7b, 7.24e9), (gpt2, 124.4e6), (falcon_7b, 6.92e9)):
        arch = parse_arch(cfg)
        assert arch is not None and arch.num_params == pytest.approx(size, rel=0.01), cfg["model_type"]


# Sanity of the memory model ----------


def per_device(spec: JobSpec, cfg: dict[str, Any]) -> int:
    est = estimate_memory(spec, cfg, device_memory_bytes=A100).per_device_bytes
    assert est is not None
    return est


def test_lora_needs_far_less_than_full_finetuning() -> None:
    full = one_gpu("falcon-180b-lora-zero3", lora=None)
    lora = one_gpu("falcon-180b-lora-zero3")
    assert per_device(lora, config(FALCON)) < per_device(full, config(FALCON)) / 5


def test_gradient_checkpointing_lowers_activations() -> None:
    on = estimate_memory(example("llama2-70b-fsdp"), config(LLAMA), device_memory_bytes=A100)
    off_spec = example("llama2-70b-fsdp", training__gradient_checkpointing=False)
    off = estimate_memory(off_spec, config(LLAMA), device_memory_bytes=A100)
    assert off.breakdown["activations"] > 10 * on.breakdown["activations"]
    assert off.fits is False and on.fits is True
    # Activations grow with the micro-batch and the sequence.
    bigger = example("llama2-70b-fsdp", training__per_device_train_batch_size=4)
    assert per_device(bigger, config(LLAMA)) > per_device(example("llama2-70b-fsdp"), config(LLAMA))


@pytest.mark.parametrize(
    "dist",
    [{"strategy": "fsdp"}, {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}}],
    ids=["fsdp", "zero3"],
)
def test_more_gpus_lower_the_per_device_memory_under_sharding(dist: dict[str, Any]) -> None:
    sizes = [
        per_device(example("llama2-70b-fsdp", distributed=dist, resources__num_nodes=n), config(LLAMA))
        for n in (1, 2, 4, 8)
    ]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > 1.5 * sizes[-1]


def test_ddp_replicates_everything_and_zero_stages_shard_more_and_more() -> None:
    ddp = [
        per_device(
            example("llama2-70b-fsdp", distributed={"strategy": "ddp"}, resources__num_nodes=n), config(LLAMA)
        )
        for n in (1, 4)
    ]
    assert ddp[0] == ddp[1]
    stages = [
        per_device(
            example("llama2-70b-fsdp", distributed={"strategy": "deepspeed", "deepspeed": {"zero_stage": s}}),
            config(LLAMA),
        )
        for s in (0, 1, 2, 3)
    ]
    assert stages[0] > stages[1] > stages[2] > stages[3]


def test_offload_moves_state_off_the_device() -> None:
    base = {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}}
    off = {
        "strategy": "deepspeed",
        "deepspeed": {"zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu"},
    }
    on_device = estimate_memory(
        example("llama2-70b-fsdp", distributed=base), config(LLAMA), device_memory_bytes=A100
    )
    offloaded = estimate_memory(
        example("llama2-70b-fsdp", distributed=off), config(LLAMA), device_memory_bytes=A100
    )
    assert offloaded.breakdown["optimizer"] == 0 and offloaded.breakdown["params"] == 0
    assert offloaded.per_device_bytes is not None and on_device.per_device_bytes is not None
    assert offloaded.per_device_bytes < on_device.per_device_bytes
    fsdp_off = example("llama2-70b-fsdp", distributed__fsdp__offload_params=True)
    assert per_device(fsdp_off, config(LLAMA)) < per_device(example("llama2-70b-fsdp"), config(LLAMA))


def test_unknown_or_broken_configs_skip_the_estimate_without_raising() -> None:
    for cfg in (
        {"model_type": "whisper", "d_model": 3},
        {"model_type": "llama", "hidden_size": "x"},
        {},
        None,
    ):
        est = estimate_memory(example("llama2-70b-fsdp"), cfg, device_memory_bytes=A100)
        assert est.per_device_bytes is None and est.fits is None
        assert est.reason is not None and "estimate skipped" in est.reason
        assert estimate_disk(example("llama2-70b-fsdp"), cfg).total_bytes is None
        assert suggest_fix(example("llama2-70b-fsdp"), cfg, A100) is None


# The suggested fix ----------


def test_suggest_fix_names_the_smallest_change() -> None:
    no_ckpt = example("llama2-70b-fsdp", training__gradient_checkpointing=False)
    fix = suggest_fix(no_ckpt, config(LLAMA), A100)
    assert fix is not None and fix.startswith("it would fit with training.gradient_checkpointing: true")
    assert suggest_fix(example("llama2-70b-fsdp"), config(LLAMA), A100) is None  # already fits

    # Full fine-tuning of 70B on one GPU: the fix keeps full fine-tuning (ZeRO-3 with CPU offload); LoRA,
    # which trains something else, is only an alternative, and says so.
    fix = suggest_fix(one_gpu("llama2-70b-fsdp"), config(LLAMA), A100)
    assert fix is not None and "offload" in fix
    assert "lora" not in fix.lower()
    offload = {
        "strategy": "deepspeed",
        "deepspeed": {"zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu"},
    }
    offloaded = estimate_memory(
        one_gpu("llama2-70b-fsdp", distributed=offload), config(LLAMA), device_memory_bytes=A100
    )
    assert offloaded.fits and offloaded.host_bytes_per_node is not None
    # Offload moves the state into host RAM: the fix says how much a node then needs (about 1.9 TB).
    assert f"{offloaded.host_bytes_per_node / GiB:.0f} GiB of host RAM per node" in fix
    assert offloaded.host_bytes_per_node > 1.9e12
    alternatives = suggest_alternatives(one_gpu("llama2-70b-fsdp"), config(LLAMA), A100)
    assert len(alternatives) == 1
    assert alternatives[0].startswith("Alternatively (changes what is trained") and "lora:" in alternatives[0]
    # The sentence is true: applying LoRA plus ZeRO-3 CPU offload does fit.
    fixed = one_gpu("llama2-70b-fsdp", lora={"r": 16, "target_modules": "all-linear"}, distributed=offload)
    assert estimate_memory(fixed, config(LLAMA), device_memory_bytes=A100).fits is True
    # A LoRA job has no alternative to offer, and a job that fits needs none.
    assert suggest_alternatives(one_gpu("falcon-180b-lora-zero3"), config(FALCON), A100) == []
    assert suggest_alternatives(example("llama2-70b-fsdp"), config(LLAMA), A100) == []


def test_suggest_fix_asks_a_sharded_slurm_job_for_more_nodes() -> None:
    # Falcon LoRA on one node of 40 GB cards: the bf16 base split 8 ways does not fit, 16 ways does.
    spec = example("falcon-180b-lora-zero3", resources__num_nodes=1)
    assert estimate_memory(spec, config(FALCON), device_memory_bytes=40 * GiB).fits is False
    fix = suggest_fix(spec, config(FALCON), 40 * GiB)
    assert fix is not None and fix.startswith("it would fit with resources.num_nodes: 2 ")
    # One sequence per GPU and no accumulation to divide: twice the nodes is twice the global batch, and
    # the fix says so rather than changing the run silently.
    assert "the global batch grows from 8 to 16 sequences per step" in fix
    accumulating = example(
        "falcon-180b-lora-zero3", resources__num_nodes=1, training__gradient_accumulation_steps=4
    )
    fix = suggest_fix(accumulating, config(FALCON), 40 * GiB)
    assert fix is not None
    assert "resources.num_nodes: 2 and training.gradient_accumulation_steps: 2 (the same global batch)" in fix
    # A local job cannot grow: offload instead.
    local = example("falcon-180b-lora-zero3", resources__num_nodes=1, resources__launcher="local")
    fix = suggest_fix(local, config(FALCON), 40 * GiB)
    assert fix is not None and "offload" in fix and "num_nodes" not in fix


# What kills jobs at scale ----------


def test_a_job_that_needs_nearly_all_device_memory_does_not_fit() -> None:
    """A job needing 79.5 of 80 GiB is an OOM hours in (the caching allocator rounds and fragments)."""
    spec = example("llama2-70b-fsdp")
    need = per_device(spec, config(LLAMA))
    assert estimate_memory(spec, config(LLAMA), device_memory_bytes=int(need / 79.5 * 80)).fits is False
    roomy = int(need / USABLE_DEVICE_FRACTION) + 1
    assert estimate_memory(spec, config(LLAMA), device_memory_bytes=roomy).fits is True
    # The Llama 2 70B example job on a card of 80 decimal GB (74.5 GiB) has no such room.
    assert estimate_memory(spec, config(LLAMA), device_memory_bytes=80 * GB).fits is False


def meta_model(name: str) -> Any:
    """The model of config folder NAME with every parameter on `meta`: shapes without memory, as accelerate's
    estimate-memory builds it."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    with init_empty_weights():
        return AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(FIXTURES / name), dtype=torch.float32
        )


ZERO3_OFFLOADS = [("none", "none"), ("cpu", "none"), ("cpu", "cpu")]


@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize("zero3_init", [True, False])
@pytest.mark.parametrize(("offload_optimizer", "offload_params"), ZERO3_OFFLOADS)
@pytest.mark.parametrize("model", [LLAMA, FALCON])
def test_zero3_model_states_follow_deepspeeds_own_formula(
    model: str, offload_optimizer: str, offload_params: str, zero3_init: bool, nodes: int
) -> None:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    cfg = config(model)
    arch = parse_arch(cfg)
    assert arch is not None
    ds = {
        "zero_stage": 3,
        "offload_optimizer": offload_optimizer,
        "offload_params": offload_params,
        "zero3_init": zero3_init,
    }
    spec = example(
        "llama2-70b-fsdp",
        lora=None,
        distributed={"strategy": "deepspeed", "deepspeed": ds},
        resources__num_nodes=nodes,
    )
    est = estimate_memory(spec, cfg, device_memory_bytes=A100)
    cpu_mem, gpu_mem, largest_layer_memory = estimate_zero3_model_states_mem_needs(
        total_params=arch.num_params,
        largest_layer_params=arch.largest_module_params,
        num_gpus_per_node=8,
        num_nodes=nodes,
        cpu_offload=offload_optimizer == "cpu",
        cpu_offload_params=offload_params == "cpu",
        zero_init=zero3_init,
    )
    b, host = est.breakdown, est.host_breakdown
    assert b["largest_layer"] == largest_layer_memory
    assert b["params"] + b["grads"] + b["optimizer"] + b["largest_layer"] == pytest.approx(gpu_mem, abs=2)
    # DeepSpeed's host figure per node is the larger of loading and what it offloads.
    assert max(host["loading"], host["offload"]) == pytest.approx(cpu_mem, abs=2)


@pytest.mark.parametrize("model", [LLAMA, FALCON])
def test_largest_layer_is_deepspeeds_and_sizes_are_accelerates(model: str) -> None:
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes
    from deepspeed.runtime.zero.stage3 import model_to_params

    arch = parse_arch(config(model))
    assert arch is not None
    meta = meta_model(model)
    assert arch.largest_module_params == model_to_params(meta)[1]
    total_fp32, (largest_fp32, _) = calculate_maximum_sizes(meta)
    assert 4 * max(arch.layer_params, arch.embedding_params) == largest_fp32
    if model == LLAMA:  # (Falcon's meta model leaves its head untied; the checkpoint ties it)
        assert 4 * arch.num_params == pytest.approx(total_fp32, rel=1e-8)
        # `accelerate estimate-memory`'s "Training using Adam" in float32 is the 16 bytes per parameter
        # of one unsharded float32 process; in bf16 it omits what full fine-tuning keeps in fp32.
        fp32 = one_gpu("llama2-70b-fsdp", training__mixed_precision="no", model__attn_implementation="sdpa")
        b = estimate_memory(fp32, config(model), device_memory_bytes=A100).breakdown
        ours = b["params"] + b["grads"] + b["optimizer"]
        assert ours == pytest.approx(max(estimate_training_usage(total_fp32, "float32").values()), rel=1e-8)
        bf16 = estimate_memory(one_gpu("llama2-70b-fsdp"), config(model), device_memory_bytes=A100).breakdown
        assert bf16["params"] + bf16["grads"] + bf16["optimizer"] >= max(
            estimate_training_usage(total_fp32, "bfloat16").values()
        )


def test_host_ram_per_node_counts_loading_the_final_gather_and_offload() -> None:
    cfg = config(LLAMA)
    n = 68_976_648_192
    efficient = estimate_memory(example("llama2-70b-fsdp"), cfg, device_memory_bytes=A100)
    every_rank = example("llama2-70b-fsdp", distributed__fsdp__cpu_ram_efficient_loading=False)
    wasteful = estimate_memory(every_rank, cfg, device_memory_bytes=A100)
    # FSDP loads float32: one copy per node with RAM-efficient loading, eight without (~2.2 TB).
    assert efficient.host_breakdown["loading"] == 4 * n
    assert wasteful.host_breakdown["loading"] == 8 * 4 * n
    assert wasteful.host_bytes_per_node is not None and wasteful.host_bytes_per_node > 2.2e12
    # A full fine-tune's final/ is gathered on rank 0's CPU in float32; a LoRA job's is the adapter.
    assert efficient.host_breakdown["final_gather"] == 4 * n
    lora = example("llama2-70b-fsdp", lora={"r": 16, "target_modules": "all-linear"})
    lora_est = estimate_memory(lora, cfg, device_memory_bytes=A100)
    assert lora_est.host_breakdown["final_gather"] == 4 * (lora_est.trainable_parameters or 0) < 2 * GB
    # Unknown host RAM is reported, not checked; a node with 1 TiB holds one copy but not eight.
    assert efficient.host_fits is None and efficient.fits is True
    node = 1024 * GiB
    on_node = estimate_memory(
        example("llama2-70b-fsdp"), cfg, device_memory_bytes=A100, host_memory_bytes=node
    )
    assert on_node.host_fits is True and on_node.fits is True
    refused = estimate_memory(every_rank, cfg, device_memory_bytes=A100, host_memory_bytes=node)
    assert refused.host_fits is False and refused.fits is False
    fix = suggest_fix(every_rank, cfg, A100, node)
    assert fix is not None and fix.startswith(
        "it would fit with distributed.fsdp.cpu_ram_efficient_loading: true"
    )
    # ZeRO-3 offload of a 70B full fine-tune on one node: DeepSpeed's 18 bytes x 1.5 per parameter.
    offload = {
        "strategy": "deepspeed",
        "deepspeed": {"zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu"},
    }
    offloaded = estimate_memory(
        one_gpu("llama2-70b-fsdp", distributed=offload), cfg, device_memory_bytes=A100
    )
    assert offloaded.host_breakdown["offload"] == pytest.approx(18 * 1.5 * n, abs=2)
    # ... so on a 1 TiB node the offload fix is not offered, and nothing else keeps full fine-tuning.
    assert suggest_fix(one_gpu("llama2-70b-fsdp"), cfg, A100, node) is None


def test_the_loss_head_costs_what_trls_fused_head_allocates() -> None:
    """TRL's SFTTrainer never builds the (batch, seq, vocab) logits: its fused head works in tiles, so the
    cost hardly grows with the batch; a full fine-tune pays the head's float32 gradient, LoRA does not."""
    llama3_8b = {
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    }  # fmt: skip
    one = one_gpu("llama2-70b-fsdp", training__max_seq_len=4096)
    four = one_gpu("llama2-70b-fsdp", training__max_seq_len=4096, training__per_device_train_batch_size=4)
    lora = one_gpu("llama2-70b-fsdp", training__max_seq_len=4096, lora={"r": 16})

    def head(spec: JobSpec) -> int:
        return estimate_memory(spec, llama3_8b, device_memory_bytes=A100).breakdown["logits"]

    # Materialized logits with their float32 upcast and gradient would be 10 bytes x 4 x 4096 x 128256.
    assert head(four) < 10 * 4 * 4096 * 128256 / 3
    assert head(four) - head(one) == 3 * 4096 * 4096 * (2 + 4)  # saved hidden states and their fp32 grad
    assert head(one) - head(lora) == 128256 * 4096 * (4 + 4)  # the head's fp32 gradient and its cast


# Disk ----------


def test_disk_for_the_falcon_lora_job() -> None:
    cfg = config(FALCON)
    spec = example("falcon-180b-lora-zero3")
    disk = estimate_disk(spec, cfg)
    assert disk.num_checkpoints == 50  # 5000 steps, every 100
    arch = parse_arch(cfg)
    assert arch is not None and spec.lora is not None
    assert disk.final_bytes == lora_params(arch, spec.lora) * 4  # the fp32 adapter
    assert disk.checkpoint_bytes is not None and disk.final_bytes is not None
    assert disk.total_bytes == disk.checkpoint_bytes * 50 + disk.final_bytes
    assert disk.total_bytes < 500 * GB
    limited = estimate_disk(example("falcon-180b-lora-zero3", training__save_total_limit=3), cfg)
    assert limited.checkpoints_on_disk == 4  # the newest is written before the oldest is deleted


def test_disk_for_the_llama_full_finetune() -> None:
    disk = estimate_disk(example("llama2-70b-fsdp"), config(LLAMA))
    assert disk.num_checkpoints == 2  # 500 steps, every 250
    # fp32 weights + two Adam moments per parameter, sharded across the ranks' files.
    assert disk.checkpoint_bytes == pytest.approx(69e9 * 12, rel=0.01)
    # final/ in bf16 (training.save_dtype auto, training in bf16): 138 GB, not fp32's 276 GB.
    assert disk.final_bytes == pytest.approx(69e9 * 2, rel=0.01)
    fp32 = estimate_disk(example("llama2-70b-fsdp", training__save_dtype="fp32"), config(LLAMA))
    assert fp32.final_bytes == pytest.approx(69e9 * 4, rel=0.01)
    no_amp = estimate_disk(
        example("llama2-70b-fsdp", training__mixed_precision="no", model__attn_implementation="sdpa"),
        config(LLAMA),
    )
    assert no_amp.final_bytes == pytest.approx(69e9 * 4, rel=0.01)
    odd = estimate_disk(example("llama2-70b-fsdp", training__max_steps=501), config(LLAMA))
    assert odd.num_checkpoints == 3  # the last step is saved too


def test_disk_when_training_by_epochs() -> None:
    spec = example("llama2-70b-fsdp", training__max_steps=None, training__num_train_epochs=1)
    disk = estimate_disk(spec, config(LLAMA))
    assert disk.num_checkpoints is None and disk.total_bytes is None
    assert disk.reason is not None and "epochs" in disk.reason
    spec = example(
        "llama2-70b-fsdp",
        training__max_steps=None,
        training__num_train_epochs=1,
        training__save_total_limit=2,
    )
    assert estimate_disk(spec, config(LLAMA)).total_bytes == pytest.approx(3 * 69e9 * 12 + 69e9 * 2, rel=0.01)


# Loading configs ----------


def test_load_model_config_from_local_paths(tmp_path: Path) -> None:
    cfg, reason = load_model_config(str(FIXTURES / LLAMA))
    assert reason is None and cfg is not None and cfg["hidden_size"] == 8192
    cfg, reason = load_model_config(str(FIXTURES / LLAMA / "config.json"))
    assert cfg is not None
    (tmp_path / "config.json").write_text("{not json")
    cfg, reason = load_model_config(str(tmp_path))
    assert cfg is None and reason is not None and "could not read" in reason
    cfg, reason = load_model_config(str(tmp_path / "missing"))
    assert cfg is None and reason is not None
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "config.json").write_text("[1, 2]")
    assert load_model_config(str(tmp_path / "list"))[0] is None


def test_full_fine_tuning_dpo_counts_the_reference_model_as_weights_only() -> None:
    """DPO/KTO without LoRA hold a frozen reference (TRL loads it in the policy's dtype): weights only,
    sharded as the launch shards models; none with LoRA or with precomputed reference log-probs."""
    llama = config(LLAMA)
    total = parse_arch(llama).num_params  # type: ignore[union-attr]
    full: dict[str, Any] = {"lora": None, "training__packing": False, "dataset__format": "auto"}
    sft = estimate_memory(example("llama2-70b-fsdp", **full), llama, device_memory_bytes=A100)
    dpo_spec = example("llama2-70b-fsdp", training__method="dpo", **full)
    dpo = estimate_memory(dpo_spec, llama, device_memory_bytes=A100)
    # FSDP: sharded over the 16 ranks, in fp32 (FSDP's load dtype); grads and optimizer unchanged.
    assert dpo.breakdown["reference_model"] == total * 4 // 16
    assert "reference_model" not in sft.breakdown
    assert (dpo.breakdown["grads"], dpo.breakdown["optimizer"]) == (
        sft.breakdown["grads"],
        sft.breakdown["optimizer"],
    )
    # Every rank reads the reference whole before FSDP shards it (8 ranks a node, fp32).
    assert dpo.host_breakdown["loading"] == sft.host_breakdown["loading"] + total * 4 * 8
    # Chosen and rejected run in one batch: twice the activations.
    assert dpo.breakdown["activations"] == 2 * sft.breakdown["activations"]
    assert (dpo.per_device_bytes or 0) > (sft.per_device_bytes or 0) + total * 4 // 16

    kto = estimate_memory(
        example("llama2-70b-fsdp", training__method="kto", training__per_device_train_batch_size=2, **full),
        llama,
        device_memory_bytes=A100,
    )
    assert kto.breakdown["reference_model"] == total * 4 // 16
    lora_spec = example("llama2-70b-fsdp", training__method="dpo", **{**full, "lora": {"r": 16}})
    lora = estimate_memory(lora_spec, llama, device_memory_bytes=A100)
    assert "reference_model" not in lora.breakdown  # the base with the adapter disabled is the reference
    pre = example(
        "llama2-70b-fsdp", training__method="dpo", training__dpo={"precompute_ref_log_probs": True}, **full
    )
    assert "reference_model" not in estimate_memory(pre, llama, device_memory_bytes=A100).breakdown

    zero3 = example(
        "falcon-180b-lora-zero3",
        lora=None,
        training__method="dpo",
        training__mixed_precision="bf16",
        training__packing=False,
        dataset__format="auto",
    )
    falcon = config(FALCON)
    est = estimate_memory(zero3, falcon, device_memory_bytes=A100)
    world = zero3.resources.world_size
    assert est.breakdown["reference_model"] == parse_arch(falcon).num_params * 2 // world  # type: ignore[union-attr]
    ddp = one_gpu("llama2-70b-fsdp", training__method="dpo", **full)
    assert estimate_memory(ddp, llama, device_memory_bytes=A100).breakdown["reference_model"] == total * 4


# Issue 27 (11): QLoRA's 4-bit base weights ----------


def test_qlora_counts_4_bit_base_weights_so_llama_70b_lora_fits_one_gpu_per_replica() -> None:
    lora: dict[str, Any] = {"r": 16, "alpha": 32, "target_modules": "all-linear"}
    one_node = {"resources__num_nodes": 1, "resources__launcher": "local", "distributed": {"strategy": "ddp"}}
    plain = estimate_memory(
        example("llama2-70b-fsdp", lora=lora, **one_node), config(LLAMA), device_memory_bytes=A100
    )
    qlora = estimate_memory(
        example("llama2-70b-fsdp", lora={**lora, "quantization": {"bits": 4}}, **one_node),
        config(LLAMA),
        device_memory_bytes=A100,
    )
    arch = parse_arch(config(LLAMA))
    assert arch is not None
    linear = arch.layers * sum(lin.d_in * lin.d_out for lin in arch.linears)
    adapters = plain.breakdown["params"] - 2 * arch.num_params
    # The decoder's Linear weights at 0.5 byte + double-quantized scales; embeddings and head in bf16.
    want = linear * (0.5 + 1 / 64 + 4 / (64 * 256)) + (arch.num_params - linear) * 2 + adapters
    assert qlora.breakdown["params"] == pytest.approx(want, rel=1e-6)
    assert plain.fits is False and qlora.fits is True  # 129 GiB of bf16 weights vs about 35 GiB
    single = estimate_memory(
        example(
            "llama2-70b-fsdp",
            lora={**lora, "quantization": {"bits": 4, "double_quant": False}},
            **one_node,
        ),
        config(LLAMA),
        device_memory_bytes=A100,
    )
    assert single.breakdown["params"] > qlora.breakdown["params"]  # fp32 scales per 64 weights
