"""The generation engine (ftq.engine.LocalEngine: vLLM's OpenAI-compatible server from .venv-vllm) serves
what a LoRA adapter makes: on the catalog's `ftq-tiny-serve` model, its greedy chat completions with a
PEFT adapter loaded at run time equal transformers + PEFT's on the same adapter folder (float32, the
model's chat template: the same token ids and text), and the base's differ.

One engine for the module (about 30-60 s to start on the 2-core machine). The adapter is PEFT's own, with
random A and B (init_lora_weights=False, seeded), saved as the trainer saves one: a real adapter folder,
without training one. Cold start (spawn to first token) and warm latency are printed and recorded as
JUnit properties (`make test`'s build/test-results.xml)."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai import NotFoundError, OpenAI

from ftq.engine import EngineConfig, LocalEngine
from service.openai.models import TINY_SERVE_ALIAS, catalog
from tests.harness import EXAMPLES, tiny_assets

pytestmark = pytest.mark.slow

PROMPTS = ["count from three.", "what does alice have?", "describe an animal."]
MAX_TOKENS = 16
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class Started:
    engine: LocalEngine
    sdk: OpenAI
    ready_s: float  # spawn to /health answering
    first_token_s: float  # spawn to the first streamed token of the first request


@pytest.fixture(scope="module")
def serve_model() -> Path:
    """The built-in catalog's ftq-tiny-serve model (examples/tiny/model-serve, which make install builds)."""
    tiny_assets()
    path = str(catalog("").templates[TINY_SERVE_ALIAS]["model"]["name_or_path"])
    model = (EXAMPLES / path).resolve()
    # vLLM's CPU attention needs head_dim >= 32 (the tiny model's 16 is refused).
    assert json.loads((model / "config.json").read_text())["head_dim"] == 64, model
    return model


@pytest.fixture(scope="module")
def adapter(serve_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(serve_model, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS, init_lora_weights=False)
    out = tmp_path_factory.mktemp("adapter") / "final"
    get_peft_model(model, config).save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def started(serve_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    log = tmp_path_factory.mktemp("engine") / "vllm.log"
    config = EngineConfig(model=serve_model, name=TINY_SERVE_ALIAS, max_lora_rank=16)
    engine = LocalEngine(config, log_path=log, die_with_parent=True)
    spawn = time.monotonic()
    engine.start()
    try:
        engine.wait_ready(timeout=600)
        ready = time.monotonic() - spawn
        key = engine.headers["Authorization"].removeprefix("Bearer ")
        sdk = OpenAI(base_url=engine.base_url, api_key=key, max_retries=0)
        stream = sdk.chat.completions.create(
            model=engine.model,
            messages=[{"role": "user", "content": PROMPTS[0]}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
        )
        first = None
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.monotonic() - spawn
        assert first is not None, engine.log_tail()
        yield Started(engine, sdk, ready, first)
    finally:
        group = engine.pid
        engine.close()
        # stop() ends the server's whole session: the API server, its engine core and the core's worker.
        assert group is not None
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)


def _served(sdk: OpenAI, model: str, prompt: str) -> tuple[list[int], list[int], str]:
    """(prompt token ids, completion token ids, text) of the engine's greedy chat completion."""
    r = sdk.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    extra: dict[str, Any] = r.model_extra or {}
    choice_extra: dict[str, Any] = r.choices[0].model_extra or {}
    text = _whole(r.choices[0].message.content)
    return list(extra["prompt_token_ids"]), list(choice_extra["token_ids"]), text


def _whole(text: str | None) -> str:
    """The text without a last character cut off mid-way (U+FFFD): the tiny model's random answers hold
    byte-level tokens, and vLLM's incremental detokenizer holds back the bytes of a character that the
    last token left incomplete, where a whole decode shows them as U+FFFD."""
    return (text or "").rstrip("\ufffd")


def _reference(model_dir: Path, adapter: Path | None) -> dict[str, tuple[list[int], list[int], str]]:
    """transformers (+ PEFT on `adapter`) greedy, float32, the same chat template: per prompt."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    out = {}
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        enc = tok.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=MAX_TOKENS, do_sample=False)
        prompt_ids = enc["input_ids"][0].tolist()
        completion = ids[0, len(prompt_ids) :].tolist()
        if tok.eos_token_id in completion:  # vLLM's token_ids stop before it too
            completion = completion[: completion.index(tok.eos_token_id)]
        out[prompt] = (prompt_ids, completion, _whole(tok.decode(completion, skip_special_tokens=True)))
    return out


def test_the_engine_serves_the_adapters_greedy_output(
    started: Started, adapter: Path, serve_model: Path, record_property: Any
) -> None:
    engine, sdk = started.engine, started.sdk
    engine.load_adapter("ft-adapter", adapter)
    assert engine.adapters() == ["ft-adapter"]
    assert engine.healthy()

    lora_ref = _reference(serve_model, adapter)
    base_ref = _reference(serve_model, None)
    for prompt in PROMPTS:
        served = _served(sdk, "ft-adapter", prompt)
        assert served == lora_ref[prompt], (prompt, served, lora_ref[prompt])
        base = _served(sdk, engine.model, prompt)
        assert base == base_ref[prompt], (prompt, base, base_ref[prompt])
        assert base[1] != served[1], prompt  # the adapter is what makes the answer

    # Warm: the same request again and again, after the ones above.
    times = []
    for _ in range(5):
        t = time.monotonic()
        _served(sdk, "ft-adapter", PROMPTS[0])
        times.append(time.monotonic() - t)
    t = time.monotonic()
    first = None
    for chunk in sdk.chat.completions.create(
        model="ft-adapter",
        messages=[{"role": "user", "content": PROMPTS[1]}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    ):
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.monotonic() - t
    figures = {
        "engine_ready_s": round(started.ready_s, 2),
        "cold_first_token_s": round(started.first_token_s, 2),
        f"warm_{MAX_TOKENS}_tokens_median_s": round(statistics.median(times), 3),
        "warm_first_token_s": round(first or -1.0, 3),
    }
    for name, value in figures.items():
        record_property(name, value)
    print(f"\nengine figures: {figures}")


def test_no_one_without_the_engines_key_calls_it_or_loads_adapters(started: Started, adapter: Path) -> None:
    """Any process on the host reaches 127.0.0.1: without the engine's own key, vLLM answers 401 to a
    completion and to loading an adapter (which would put another owner's adapter in reach)."""
    import httpx

    engine = started.engine
    body = {"model": engine.model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    assert httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=30).status_code == 401
    load = {"lora_name": "intruder", "lora_path": str(adapter)}
    assert httpx.post(f"{engine.base_url}/load_lora_adapter", json=load, timeout=30).status_code == 401
    assert "intruder" not in engine.adapters()


def test_an_unloaded_adapter_is_no_longer_served(started: Started, adapter: Path) -> None:
    engine, sdk = started.engine, started.sdk
    engine.load_adapter("gone-soon", adapter)
    assert "gone-soon" in engine.adapters()
    engine.unload_adapter("gone-soon")
    assert "gone-soon" not in engine.adapters()
    with pytest.raises(NotFoundError):
        _served(sdk, "gone-soon", PROMPTS[0])
