"""ftq's generation engine (issue 49): vLLM's OpenAI-compatible server serving one base model and the LoRA
adapters loaded into it at run time.

    from ftq.engine import EngineConfig, LocalEngine

    with LocalEngine(EngineConfig(model=Path("examples/tiny/model-serve"))) as engine:
        engine.wait_ready()
        engine.load_adapter("my-job", Path(".ftq/runs/<job>/final"))
        # POST {engine.base_url}/chat/completions with model="my-job" (or engine.model for the base)

`Engine` (ftq.engine.base) is what callers hold; `LocalEngine` (ftq.engine.local) runs one on this machine
from `.venv-vllm`, the venv `make vllm` builds (vLLM pins a transformers that ftq's own venv cannot have).
Of ftq this package imports only the contract, and of the rest the standard library and httpx (an
import-linter rule in pyproject.toml), so the service, the worker and the trainer (evaluations) may all
start an engine."""

from ftq.engine.base import (
    INSTALL_COMMAND,
    VLLM_LORA_RANKS,
    Engine,
    EngineConfig,
    EngineError,
    EngineNotInstalled,
    adapter_rank,
    lora_rank_slot,
)
from ftq.engine.local import LocalEngine, default_venv

__all__ = [
    "INSTALL_COMMAND",
    "VLLM_LORA_RANKS",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineNotInstalled",
    "LocalEngine",
    "adapter_rank",
    "default_venv",
    "lora_rank_slot",
]
