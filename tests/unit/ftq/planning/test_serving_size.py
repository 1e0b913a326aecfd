"""The GPUs one serving engine takes (ftq.planning.serving): one where one GPU holds the base with room
for its KV cache, else tensor parallel over the fewest of a node's GPUs that do (a power of two dividing
the attention heads), and a refusal saying what it would take where a node cannot."""

from __future__ import annotations

from typing import Any

import pytest

from ftq.planning.serving import GIB, TooLarge, engine_size, weights_bytes

H100 = 80 * GIB


def llama(hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int = 128256) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "torch_dtype": "bfloat16",
    }


LLAMA_8B = llama(4096, 32, 32, 8, 14336)
LLAMA_70B = llama(8192, 80, 64, 8, 28672)
LLAMA_405B = llama(16384, 126, 128, 8, 53248)


def test_the_weights_are_counted_from_the_architecture_in_their_dtype() -> None:
    assert weights_bytes(LLAMA_8B) == pytest.approx(16.06e9, rel=0.01)
    assert weights_bytes(LLAMA_70B) == pytest.approx(141.1e9, rel=0.01)
    assert weights_bytes({**LLAMA_8B, "torch_dtype": "float32"}) == 2 * (weights_bytes(LLAMA_8B) or 0)
    assert weights_bytes({"model_type": "unknown"}) is None


def test_one_gpu_holds_8b_and_70b_is_split_over_four() -> None:
    assert engine_size(LLAMA_8B, device="cuda", gpu_memory_bytes=H100, gpus_per_node=8).devices == 1
    size = engine_size(LLAMA_70B, device="cuda", gpu_memory_bytes=H100, gpus_per_node=8)
    # 141 GB over 4 is 35 GB a GPU, within 60% of 80 GiB; over 2 it is 70 GB, not.
    assert (size.devices, size.tensor_parallel) == (4, 4)
    # On 40 GB cards it takes all eight.
    assert engine_size(LLAMA_70B, device="cuda", gpu_memory_bytes=40 * GIB, gpus_per_node=8).devices == 8


def test_a_base_no_node_holds_is_refused_saying_what_it_would_take() -> None:
    with pytest.raises(TooLarge, match=r"weights are 75[0-9.]+ GiB.*8 GPU\(s\) of 80 GiB"):
        engine_size(LLAMA_405B, device="cuda", gpu_memory_bytes=H100, gpus_per_node=8)
    with pytest.raises(TooLarge):  # a node of two cards cannot hold 70B
        engine_size(LLAMA_70B, device="cuda", gpu_memory_bytes=H100, gpus_per_node=2)


def test_tensor_parallel_divides_the_attention_heads() -> None:
    # 20 heads: 8 does not divide them, so a base that needs more than four GPUs cannot be split.
    odd = {**LLAMA_70B, "num_attention_heads": 20, "num_key_value_heads": 4, "head_dim": 256}
    with pytest.raises(TooLarge):
        engine_size(odd, device="cuda", gpu_memory_bytes=40 * GIB, gpus_per_node=8)


def test_a_cpu_engine_is_one_slot() -> None:
    size = engine_size(LLAMA_70B, device="cpu", gpu_memory_bytes=H100, gpus_per_node=8)
    assert (size.devices, size.tensor_parallel) == (1, 1)
