"""Tinker sampling through the serving engine (issue 52 with issue 49's engines): a sampling session on
saved sampler weights is served by the owner's vLLM engine for the base (`service.serving.engines`: a
deployment the scheduler places, shared with the owner's /v1 calls), the sampler folder loaded into it as a
LoRA adapter, the prompt sent as token ids to its /v1/completions with the sampled tokens' logprobs.

Where the engine cannot serve it, the training client's own process samples instead (`trainer.tinker_host`,
a forward pass per token with the KV cache): vLLM not installed, a base the engine cannot serve (on the
CPU, attention heads under 32 wide: the catalog's ftq-tiny), an adapter on the embeddings or the output
layer (`train_unembed`, the SDK's default: vLLM's LoRA takes neither), a rank above the engines', and the
calls the engine's answer does not carry as the SDK wants them (compute_logprobs' prompt logprobs, the
base alone). `why_not` says which.

Both give the model's own log-softmax of each sampled token (vLLM's raw logprobs, before temperature),
so importance ratios against forward_backward start at 1 either way (within float error)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from ftq.engine.local import default_venv
from ftq.runtime.settings import Settings
from service.openai.errors import OpenAIError
from service.serving.engines import EngineManager
from service.serving.service import Target, _check_rank, _target
from service.tinker.runtime import CallFailed

log = logging.getLogger(__name__)

# Modules vLLM's LoRA does not take on these bases (the SDK's train_unembed puts one on lm_head).
UNSERVED_MODULES = ("lm_head", "embed_tokens", "wte", "word_embeddings")


def engine_installed() -> bool:
    venv = default_venv()
    found = any(venv.glob("lib/python3*/site-packages/vllm/__init__.py"))
    return (venv / "bin" / "python").exists() and found


def why_not(settings: Settings, alias: str, base: Path, adapter: Path | None, op: dict[str, Any]) -> str:
    """Why this sample cannot go through the engine ("" when it can)."""
    if adapter is None or op.get("base_only"):
        return "a sampler of the base alone"
    if op.get("prompt_logprobs"):
        return "prompt logprobs (compute_logprobs)"
    if not engine_installed():
        return "vLLM is not installed (make vllm)"
    try:
        config = json.loads((adapter / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return "its adapter_config.json cannot be read"
    targets = config.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)
    unserved = sorted({t for t in targets if t.rsplit(".", 1)[-1] in UNSERVED_MODULES})
    if unserved or config.get("modules_to_save"):
        on = ", ".join(unserved) or "modules_to_save"
        return f"a LoRA on {on} (train_unembed), which vLLM does not serve"
    try:
        _target(settings, alias, base, label=alias, engine_name=alias, adapter=adapter)
        _check_rank(settings, alias, adapter)
    except OpenAIError as exc:
        return str(exc)
    return ""


def target(settings: Settings, alias: str, base: Path, adapter: Path) -> Target:
    """The engine's target: the base's engine with the sampler folder as an adapter, named by the folder
    and its time (weights saved again under the same name are loaded again)."""
    found = _target(settings, alias, base, label=alias, engine_name=alias, adapter=adapter)
    stamp = (adapter / "adapter_model.safetensors").stat().st_mtime_ns
    return Target(f"tinker:{adapter.parent.name}/{adapter.name}:{stamp}", found.base, alias, alias, adapter,
                  found.max_model_len)  # fmt: skip


def sample(
    engines: EngineManager, http: Any, owner: str, t: Target, op: dict[str, Any], eos: int | None
) -> dict[str, Any]:
    """The host's `sample` answer (sequences of tokens, logprobs and stop reasons), from the engine."""
    lease = asyncio.run(engines.acquire(owner, t))
    try:
        params = op.get("sampling_params") or {}
        body: dict[str, Any] = {
            "model": lease.engine_model,
            "prompt": [int(x) for x in op["prompt"]],
            "n": int(op.get("num_samples") or 1),
            "max_tokens": int(params.get("max_tokens") or 16),
            "temperature": float(params.get("temperature", 1.0)),
            "top_p": float(params.get("top_p", 1.0)),
            "top_k": int(params.get("top_k", -1)),
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
        }
        if params.get("seed") is not None:
            body["seed"] = int(params["seed"])
        stop = params.get("stop")
        if stop is not None:
            stops = [stop] if isinstance(stop, str) else list(stop)
            strings = [s for s in stops if isinstance(s, str) and s]
            ids = [int(s) for s in stops if isinstance(s, int)]
            if strings:
                body["stop"] = strings
            if ids:
                body["stop_token_ids"] = ids
            body["ignore_eos"] = True  # the caller's stops replace the EOS token's, as on the host
        try:
            r = http.post(f"{lease.base_url}/completions", json=body, headers=lease.headers, timeout=600)
        except Exception as exc:
            lease.broken(f"the engine did not answer: {exc}")
            raise CallFailed(f"the serving engine did not answer ({exc})", "server") from None
        if r.status_code != 200:
            if r.status_code == 404:
                lease.adapter_gone()
            why = f"{r.status_code} {r.text[:500]}"
            raise CallFailed(f"the serving engine refused the sample: {why}", "server")
        answer = r.json()
        usage = answer.get("usage") or {}
        lease.record(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
        sequences = []
        for choice in sorted(answer["choices"], key=lambda c: int(c["index"])):
            lp = choice.get("logprobs") or {}
            tokens = [int(str(tok).rsplit(":", 1)[-1]) for tok in lp.get("tokens") or []]
            logprobs = [float(x) if x is not None else 0.0 for x in lp.get("token_logprobs") or []]
            reason = "stop" if choice.get("finish_reason") == "stop" else "length"
            sequences.append({"tokens": tokens, "logprobs": logprobs, "stop_reason": reason})
        return {"sequences": sequences, "prompt_logprobs": None, "engine": lease.engine_model}
    finally:
        lease.release()
