"""How big a serving engine is (issue 49): the GPUs one engine for a base model takes, from the same
architecture count as the training estimate (`ftq.planning.estimate.parse_arch`). One GPU where it holds
the base with room for the KV cache; otherwise tensor parallel over the fewest GPUs of one node that do (a
power of two that divides the attention heads, as vLLM requires). A CPU engine is one CPU slot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ftq.planning.estimate import parse_arch

# Of a GPU's memory, what the weights may take: vLLM uses 90% of it by default, and the KV cache, the
# activations of a batch and the LoRA slots need the rest of that to serve more than a few sequences.
WEIGHTS_SHARE = 0.6
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
GIB = 2**30


@dataclass(frozen=True)
class EngineSize:
    devices: int  # GPUs (cuda) or CPU slots (cpu) the engine holds
    tensor_parallel: int  # GPUs the base is split over
    weights_bytes: int | None  # the base's weights as served (None: not counted)


class TooLarge(ValueError):
    """No node of this server can hold the base: the message says what it would take."""


def weights_bytes(model_config: dict[str, Any]) -> int | None:
    arch = parse_arch(model_config)
    if arch is None:
        return None
    dtype = str(model_config.get("torch_dtype") or model_config.get("dtype") or "bfloat16").lower()
    return arch.num_params * _DTYPE_BYTES.get(dtype.removeprefix("torch."), 2)


def engine_size(
    model_config: dict[str, Any], *, device: str, gpu_memory_bytes: int, gpus_per_node: int
) -> EngineSize:
    """The engine's devices for this base (see the module's docstring); TooLarge when even a whole node of
    `gpus_per_node` GPUs of `gpu_memory_bytes` cannot hold it."""
    weights = weights_bytes(model_config)
    if device != "cuda":
        return EngineSize(devices=1, tensor_parallel=1, weights_bytes=weights)
    if weights is None:
        return EngineSize(devices=1, tensor_parallel=1, weights_bytes=None)
    arch = parse_arch(model_config)
    heads = arch.heads if arch is not None else 1
    budget = WEIGHTS_SHARE * gpu_memory_bytes
    tp = 1
    while tp <= max(1, gpus_per_node):
        if heads % tp == 0 and weights / tp <= budget:
            return EngineSize(devices=tp, tensor_parallel=tp, weights_bytes=weights)
        tp *= 2
    raise TooLarge(
        f"its weights are {weights / GIB:.1f} GiB: one engine needs more than the {gpus_per_node} GPU(s) "
        f"of {gpu_memory_bytes / GIB:.0f} GiB one node has here (at most {WEIGHTS_SHARE:.0%} of each for "
        "the weights)"
    )
