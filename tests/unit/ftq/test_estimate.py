"""ftq.estimate: the acceptance figures for the two article jobs from their config.json alone, parameter
counts checked against real (tiny) transformers models and PEFT, and the sanity of the memory model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ftq.estimate import (
    estimate_disk,
    estimate_memory,
    load_model_config,
    lora_params,
    parse_arch,
    suggest_fix,
)
from ftq.spec import JobSpec
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


# Acceptance: the two article jobs ----------


@pytest.mark.parametrize("name", ["llama2-70b-fsdp", "llama2-70b-fsdp1"])
def test_llama2_70b_full_finetune_over_16_gpus_fits_80gb(name: str) -> None:
    est = estimate_memory(example(name), config(LLAMA), device_memory_bytes=A100)
    assert est.per_device_bytes is not None
    assert 40 * GB <= est.per_device_bytes <= 80 * GB
    assert est.fits is True
    # Also against 80 decimal GB, the way GPU memory is sold.
    assert estimate_memory(example(name), config(LLAMA), device_memory_bytes=80 * GB).fits is True
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
    assert est.per_device_bytes < 80 * GB
    # The frozen base in bf16 is sharded 16 ways; it dominates the LoRA job's memory.
    assert est.breakdown["params"] == pytest.approx(est.num_parameters * 2 / 16, rel=0.01)
    assert est.trainable_parameters < 0.002 * est.num_parameters


def test_parameter_counts_of_the_article_models() -> None:
    llama = parse_arch(config(LLAMA))
    falcon = parse_arch(config(FALCON))
    assert llama is not None and falcon is not None
    assert llama.num_params == pytest.approx(69.0e9, rel=0.01)
    assert falcon.num_params == pytest.approx(179.5e9, rel=0.01)
    # Falcon 180B: new decoder architecture, 232 query heads sharing 8 key/value heads.
    assert falcon.linears[0].d_out == (232 + 2 * 8) * 64


# Parameter counts against real models ----------

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
    "mistral": {
        "model_type": "mistral",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 200,
    },
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 200,
        "tie_word_embeddings": True,
    },
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

    fix = suggest_fix(one_gpu("llama2-70b-fsdp"), config(LLAMA), A100)
    assert fix is not None and "LoRA" in fix and "offload" in fix
    # The sentence is true: applying LoRA plus ZeRO-3 CPU offload does fit.
    fixed = one_gpu(
        "llama2-70b-fsdp",
        lora={"r": 16, "target_modules": "all-linear"},
        distributed={
            "strategy": "deepspeed",
            "deepspeed": {"zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu"},
        },
    )
    assert estimate_memory(fixed, config(LLAMA), device_memory_bytes=A100).fits is True


def test_suggest_fix_asks_a_sharded_slurm_job_for_more_nodes() -> None:
    # Falcon LoRA on one node of 40 GB cards: the bf16 base split 8 ways does not fit, 16 ways does.
    spec = example("falcon-180b-lora-zero3", resources__num_nodes=1)
    assert estimate_memory(spec, config(FALCON), device_memory_bytes=40 * GiB).fits is False
    fix = suggest_fix(spec, config(FALCON), 40 * GiB)
    assert fix is not None and fix.startswith("it would fit with resources.num_nodes: 2 ")
    # A local job cannot grow: offload instead.
    local = example("falcon-180b-lora-zero3", resources__num_nodes=1, resources__launcher="local")
    fix = suggest_fix(local, config(FALCON), 40 * GiB)
    assert fix is not None and "offload" in fix and "num_nodes" not in fix


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
    assert disk.final_bytes == pytest.approx(69e9 * 4, rel=0.01)
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
    assert estimate_disk(spec, config(LLAMA)).total_bytes == pytest.approx(3 * 69e9 * 12 + 69e9 * 4, rel=0.01)


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
