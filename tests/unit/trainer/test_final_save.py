"""The pure parts of the final save (trainer/train.py): the wait's bound and FSDP1 adapter names."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.train import _peft_key, save_wait_timeout


def test_the_wait_for_rank_0s_write_follows_the_size_of_the_write() -> None:
    assert save_wait_timeout(0) == 1800  # never below the usual collective timeout
    assert save_wait_timeout(1_300_000) == 1800  # a LoRA adapter
    # Llama 2 70B in float32 (276 GB) at a slow 25 MB/s: ~3 h, far past the 30 min collective timeout.
    assert save_wait_timeout(276_000_000_000) == pytest.approx(11_040)


@pytest.mark.parametrize(
    ("fsdp1_name", "peft_name"),
    [
        # A LoRA matrix: accelerate wraps it as its own unit inside the decoder layer's unit.
        (
            "_fsdp_wrapped_module.base_model.model.model.layers.0._fsdp_wrapped_module.self_attn.q_proj"
            ".lora_A.default._fsdp_wrapped_module.weight",
            "base_model.model.model.layers.0._fsdp_wrapped_module.self_attn.q_proj.lora_A.default.weight",
        ),
        # With FSDP activation checkpointing the layer is also a CheckpointWrapper.
        (
            "_fsdp_wrapped_module.base_model.model.model.layers.3._fsdp_wrapped_module"
            "._checkpoint_wrapped_module.mlp.down_proj.lora_B.default._fsdp_wrapped_module.weight",
            "base_model.model.model.layers.3._fsdp_wrapped_module._checkpoint_wrapped_module.mlp.down_proj"
            ".lora_B.default.weight",
        ),
        ("base_model.model.lm_head.weight", "base_model.model.lm_head.weight"),  # FSDP2: nothing to undo
    ],
)
def test_fsdp1_names_are_the_ones_peft_matches_its_module_names_against(
    fsdp1_name: str, peft_name: str
) -> None:
    assert _peft_key(fsdp1_name) == peft_name


# Issue 27 (9): training.save_dtype for a full fine-tune's final/ ----------


@pytest.mark.parametrize(
    ("save_dtype", "mixed_precision", "expected"),
    [("auto", "bf16", "bf16"), ("auto", "fp16", "fp16"), ("auto", "no", "fp32"), ("fp32", "bf16", "fp32")],
)
def test_auto_is_the_training_dtype(save_dtype: str, mixed_precision: str, expected: str) -> None:
    from ftq.contract.spec import resolved_save_dtype

    assert resolved_save_dtype(save_dtype, mixed_precision) == expected


@pytest.mark.parametrize(("save_dtype", "torch_name"), [("bf16", "bfloat16"), ("fp16", "float16")])
def test_the_tiny_model_is_saved_in_the_asked_dtype_and_reloads(
    tmp_path: Path, save_dtype: str, torch_name: str
) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from tests.harness import EXAMPLES
    from trainer.train import cast_state_dict, save_full_or_adapter

    model = AutoModelForCausalLM.from_pretrained(EXAMPLES / "tiny" / "model", dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = cast_state_dict(model.state_dict(), save_dtype)
    save_full_or_adapter(model, tmp_path, state)

    want = getattr(torch, torch_name)
    files = list(tmp_path.glob("*.safetensors"))
    assert files
    seen = 0
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                t = f.get_tensor(key)
                if t.is_floating_point():
                    assert t.dtype == want, key
                    seen += 1
    assert seen > 0
    # The model in memory keeps training precision; the saved copy loads with the same values, rounded.
    assert all(p.dtype == torch.float32 for p in model.parameters())
    again = AutoModelForCausalLM.from_pretrained(tmp_path, dtype="auto")
    assert next(again.parameters()).dtype == want
    for key, value in again.state_dict().items():
        assert torch.equal(value, before[key].to(want)), key
