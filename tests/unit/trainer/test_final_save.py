"""The pure parts of the final save (trainer/train.py): the wait's bound and FSDP1 adapter names."""

from __future__ import annotations

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
