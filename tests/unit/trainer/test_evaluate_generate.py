"""An evaluation's graders suite generates its prompts in batches (trainer.evaluate.generate_greedy): the
same greedy text, prompt for prompt, as one generate per prompt, whatever the batch's lengths."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness import REPO
from trainer import evaluate

MODEL = REPO / "examples" / "tiny" / "model"
PROMPTS = ["a b c d e", "four five six seven", "the black dog chases the", "one", "alice has twelve"]


def _one_at_a_time(model: Any, tokenizer: Any, prompts: list[list[int]], new: int) -> list[str]:
    import torch

    out = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            row = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                 do_sample=False, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        out.append(tokenizer.decode(row[0, len(p) :], skip_special_tokens=True))
    return out


def test_batched_greedy_equals_one_prompt_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    prompts = [evaluate._prompt_ids(tokenizer, p) for p in PROMPTS]
    assert len({len(p) for p in prompts}) > 1  # the batch pads
    monkeypatch.setattr(evaluate, "GENERATE_BATCH", 3)  # two batches, the second shorter
    batched = evaluate.generate_greedy(model, tokenizer, prompts, 6)
    assert batched == _one_at_a_time(model, tokenizer, prompts, 6)
    assert len(set(batched)) > 1
