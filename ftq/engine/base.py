"""What every generation engine is (`Engine`), what one serves (`EngineConfig`), its errors, and the LoRA
ranks vLLM can hold."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

# The one command that installs the engine (the Makefile's `vllm` target: .venv-vllm, ~3.5 GB).
INSTALL_COMMAND = "make vllm"
# vLLM sizes its LoRA slots for one of these ranks (`--max-lora-rank`); an adapter of a higher rank than
# the engine's slot cannot be loaded into it. ftq's spec allows r up to 4096: past 512 vLLM cannot serve it.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class EngineError(RuntimeError):
    """An engine could not start, answer, or load or unload an adapter; the message says why (for a
    process that ended, with the tail of its log)."""


class EngineNotInstalled(EngineError):
    """The engine's venv is missing: the message names the command that installs it."""


def lora_rank_slot(*ranks: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that holds adapters of every one of `ranks`."""
    need = max(ranks, default=1)
    for slot in VLLM_LORA_RANKS:
        if slot >= need:
            return slot
    raise EngineError(f"LoRA rank {need} is above {VLLM_LORA_RANKS[-1]}, the highest vLLM serves")


def adapter_rank(adapter: Path) -> int:
    """The highest LoRA rank of a PEFT adapter folder (adapter_config.json's `r` and `rank_pattern`)."""
    try:
        config = json.loads((adapter / "adapter_config.json").read_text())
    except FileNotFoundError:
        raise EngineError(f"{adapter} is not a PEFT adapter: it has no adapter_config.json") from None
    except (OSError, ValueError) as exc:
        raise EngineError(f"{adapter}/adapter_config.json cannot be read: {exc}") from None
    ranks = [int(config.get("r") or 0), *(int(r) for r in (config.get("rank_pattern") or {}).values())]
    return max(ranks)


@dataclass(frozen=True)
class EngineConfig:
    """One engine: the base model it serves and how many adapters of which rank it holds at once."""

    model: Path  # the base model's folder (config.json, weights, tokenizer with its chat template)
    name: str = "base"  # the base's `model` in OpenAI requests; an adapter is called by its own name
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: str | None = None  # None: float32 on the CPU (what the tests compare with), vLLM's auto on a GPU
    max_loras: int = 4  # adapters one batch may mix
    max_lora_rank: int = 64  # rounded up to VLLM_LORA_RANKS; ftq's default r is 16, the catalog's 8
    max_model_len: int = 2048  # the longest prompt + completion, in tokens
    tensor_parallel: int = 1  # GPUs one engine spans (cuda only)
    # The KV cache on the CPU: vLLM's own default (None) reserves 90% of the host's memory, and refuses to
    # start where that much is not free.
    kv_cache_bytes: int | None = 256 * 2**20

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError("max_loras must be at least 1")
        if self.tensor_parallel < 1 or (self.tensor_parallel > 1 and self.device != "cuda"):
            raise ValueError("tensor_parallel > 1 needs device cuda")
        lora_rank_slot(self.max_lora_rank)  # raises past vLLM's highest

    @property
    def lora_rank(self) -> int:
        """The engine's LoRA slot: max_lora_rank rounded up to a rank vLLM sizes for."""
        return lora_rank_slot(self.max_lora_rank)


@runtime_checkable
class Engine(Protocol):
    """A running generation engine: an OpenAI-compatible server (`base_url`, ending in /v1) that serves
    the base as `model` and each loaded adapter under its own name."""

    @property
    def base_url(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def headers(self) -> dict[str, str]:
        """What every request to `base_url` carries: the engine's own bearer key (it answers nothing
        under /v1 without it, so no other process on the host can call or load adapters into it)."""
        ...

    def start(self) -> None:
        """Start it (returns at once: `wait_ready` waits for it to answer)."""
        ...

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Return once it answers; EngineError if it ended or did not answer within `timeout` seconds."""
        ...

    def healthy(self) -> bool:
        """Whether it is running and answers its health check now."""
        ...

    def load_adapter(self, name: str, path: Path) -> None:
        """Load the PEFT adapter folder `path`, served as `name` from then on (loading a name again
        replaces it)."""
        ...

    def unload_adapter(self, name: str) -> None:
        """Unload the adapter served as `name`."""
        ...

    def adapters(self) -> list[str]:
        """The names of the adapters it serves now."""
        ...

    def stop(self, timeout: float = 30.0) -> None:
        """Stop it and every process it started; idempotent."""
        ...
