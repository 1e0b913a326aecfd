"""`load_model` with placeholders: what a rank that FSDP fills from rank 0 builds instead of reading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftq.contract.spec import JobSpec
from trainer.model import load_model


@pytest.fixture(scope="module")
def tied_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with tied embeddings (as Llama 3.2 1B and many small models ship)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tied")
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("placeholders", ["meta", "cpu"])
def test_placeholders_hold_no_weights_but_rank_0s_buffers_and_ties(
    tied_model: Path, placeholders: str
) -> None:
    import torch

    spec = JobSpec.model_validate(
        {
            "model": {"name_or_path": str(tied_model)},
            "dataset": {"name_or_path": "/data/train.jsonl"},
            "training": {"max_steps": 1},
        }
    )
    read: Any = load_model(spec, torch.float32, "sdpa")
    built: Any = load_model(spec, torch.float32, "sdpa", placeholders=placeholders)

    assert {p.device.type for p in built.parameters()} == {placeholders}
    assert [n for n, _ in built.named_parameters()] == [n for n, _ in read.named_parameters()]
    assert all(p.dtype == torch.float32 for p in built.parameters())
    # Non-persistent buffers are in no checkpoint and FSDP does not broadcast them: computed for real.
    buffers = dict(read.named_buffers())
    assert buffers.keys() == dict(built.named_buffers()).keys()
    for name, buf in built.named_buffers():
        assert buf.device.type == "cpu" and torch.equal(buf, buffers[name]), name
    # FSDP must see one shared parameter, as rank 0's model has, or the ranks' units disagree.
    assert built.lm_head.weight is built.model.embed_tokens.weight


def test_an_adapter_is_loaded_trainable_with_its_own_weights(tied_model: Path, tmp_path: Path) -> None:
    """A job that goes on from a LoRA job's final/ (model.adapter) trains that adapter, not a new one."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trainer.model import load_adapter

    base: Any = AutoModelForCausalLM.from_pretrained(tied_model)
    made: Any = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in made.named_parameters():
            if "lora_B" in name:
                p.fill_(0.5)  # not PEFT's zeros, so that the load is seen
    made.save_pretrained(tmp_path / "final")

    spec = JobSpec.model_validate(
        {
            "model": {"name_or_path": str(tied_model), "adapter": str(tmp_path / "final")},
            "lora": {"r": 4},
            "dataset": {"name_or_path": "/data/train.jsonl"},
            "training": {"max_steps": 1},
        }
    )
    loaded: Any = load_adapter(load_model(spec, torch.float32, "sdpa"), str(spec.model.adapter))
    trainable = {n: p for n, p in loaded.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert all(torch.all(p == 0.5) for n, p in trainable.items() if "lora_B" in n)


def test_an_adapter_needs_lora() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="adapter"):
        JobSpec.model_validate(
            {
                "model": {"name_or_path": "/m", "adapter": "/runs/job_x/final"},
                "dataset": {"name_or_path": "/data/train.jsonl"},
                "training": {"max_steps": 1},
            }
        )


def test_qlora_loads_with_4_bit_nf4_weights_stored_for_sharding() -> None:
    import torch

    from ftq.contract.spec import JobSpec
    from trainer.model import quantization_config

    body: dict[str, Any] = {
        "model": {"name_or_path": "/models/m"},
        "dataset": {"name_or_path": "/data/train.jsonl"},
        "training": {"max_steps": 1},
        "resources": {"device": "cuda"},
        "lora": {"r": 8, "quantization": {"bits": 4, "compute_dtype": "bf16"}},
    }
    cfg = quantization_config(JobSpec.model_validate(body))
    assert cfg.load_in_4bit and cfg.bnb_4bit_quant_type == "nf4" and cfg.bnb_4bit_use_double_quant
    assert cfg.bnb_4bit_compute_dtype == torch.bfloat16 and cfg.bnb_4bit_quant_storage == torch.bfloat16
    body["lora"] = {"r": 8}
    assert quantization_config(JobSpec.model_validate(body)) is None
