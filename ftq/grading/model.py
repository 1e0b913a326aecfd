"""A score_model grader's generation: the allowed local model (FTQ_GRADER_SCORE_MODELS) reads the rendered
messages (its chat template where it has one) and answers greedily; ftq.grading.score parses the number.
transformers is imported on first use, so importing ftq.grading stays light."""

from __future__ import annotations

import functools
import threading
from typing import Any

from ftq.contract.graders import ScoreModelGrader

# The longest answer a score model may give (a number, perhaps with a word or two).
MAX_NEW_TOKENS = 32
_LOCK = threading.Lock()


@functools.lru_cache(maxsize=2)
def _load(model: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model)
    lm.eval()
    return tokenizer, lm


def generate(grader: ScoreModelGrader, messages: list[dict[str, str]]) -> str:
    """The model's answer to the messages (one at a time: the model is shared by the threads)."""
    params = grader.sampling_params or {}
    limit = int(params.get("max_completions_tokens") or params.get("max_tokens") or MAX_NEW_TOKENS)
    with _LOCK:
        tokenizer, lm = _load(grader.model)
        if getattr(tokenizer, "chat_template", None):
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            prompt = "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"
        inputs = tokenizer(prompt, return_tensors="pt")
        out = lm.generate(
            **inputs,
            max_new_tokens=max(1, min(limit, MAX_NEW_TOKENS)),
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
        return str(tokenizer.decode(out[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True))
