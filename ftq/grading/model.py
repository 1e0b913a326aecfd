"""A score_model grader's generation: the allowed local model (FTQ_GRADER_SCORE_MODELS) reads the rendered
messages (its chat template where it has one) and answers greedily; ftq.grading.score parses the number.
transformers is imported on first use, so importing ftq.grading stays light.

Each call's work is bounded: a prompt of more than MAX_PROMPT_TOKENS tokens (or MAX_PROMPT_CHARS
characters, refused before it is tokenized) is a GraderError, and the answer is at most MAX_NEW_TOKENS
tokens. A model is used by one thread at a time (a lock per model, not one for all of them), so a request
waits at most for the bounded calls ahead of it on the same model; who gets to call at all is the
caller's to share out (service.graders.service's slots per owner)."""

from __future__ import annotations

import functools
import threading
from typing import Any

from ftq.contract.graders import ScoreModelGrader
from ftq.grading.errors import GraderError

# The longest answer a score model may give (a number, perhaps with a word or two).
MAX_NEW_TOKENS = 32
# The longest prompt (the rendered messages in the model's chat template), in the model's tokens.
MAX_PROMPT_TOKENS = 4096
# A prompt longer than this many characters is refused without tokenizing it: to fit MAX_PROMPT_TOKENS,
# its tokens would have to average more than 16 characters, which no ordinary text does.
MAX_PROMPT_CHARS = 16 * MAX_PROMPT_TOKENS

_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock(model: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(model, threading.Lock())


@functools.lru_cache(maxsize=2)
def _load(model: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model)
    lm.eval()
    return tokenizer, lm


def max_new_tokens(grader: ScoreModelGrader) -> int:
    """The answer's length: the grader's `max_completions_tokens` (or `max_tokens`), within
    [1, MAX_NEW_TOKENS]."""
    params = grader.sampling_params or {}
    asked = params.get("max_completions_tokens") or params.get("max_tokens") or MAX_NEW_TOKENS
    try:
        limit = int(asked)
    except (TypeError, ValueError):
        raise GraderError(grader.name, f"sampling_params: max tokens {asked!r} is not a number") from None
    return max(1, min(limit, MAX_NEW_TOKENS))


def _too_long(grader: ScoreModelGrader, size: str) -> GraderError:
    return GraderError(
        grader.name, f"the prompt is {size}; a score model reads at most {MAX_PROMPT_TOKENS} tokens"
    )


def generate(grader: ScoreModelGrader, messages: list[dict[str, str]]) -> str:
    """The model's answer to the messages (one call at a time per model: the model is shared by the
    threads)."""
    limit = max_new_tokens(grader)
    chars = sum(len(m["content"]) for m in messages)
    if chars > MAX_PROMPT_CHARS:
        raise _too_long(grader, f"{chars:,} characters")
    with _lock(grader.model):
        tokenizer, lm = _load(grader.model)
        if getattr(tokenizer, "chat_template", None):
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            prompt = "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"
        inputs = tokenizer(prompt, return_tensors="pt")
        length = int(inputs["input_ids"].shape[1])
        if length > MAX_PROMPT_TOKENS:
            raise _too_long(grader, f"{length:,} tokens")
        out = lm.generate(
            **inputs,
            max_new_tokens=limit,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
        return str(tokenizer.decode(out[0][length:], skip_special_tokens=True))
