"""What the sampler feeds the model and keeps of its output (trainer/samples.py), on the tiny model's real
tokenizer: a chat model's prompt goes through its chat template as one user turn, a text model's prompt
is encoded as training encodes text; the completion stops at EOS; the cadence without an eval split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainer.samples import SampleWriter, decode_until_eos, every_steps


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir / "model")


def writer(tokenizer: Any, chat: bool) -> SampleWriter:
    return SampleWriter(Path("unused"), ["one two"], 8, tokenizer=tokenizer, chat=chat, every_steps=None)


def test_a_chat_prompt_is_one_user_turn_with_the_generation_prompt(tokenizer: Any) -> None:
    ids = writer(tokenizer, chat=True).prompt_ids("one two")
    text = tokenizer.decode(ids)
    assert text == "<|user|>\none two</s>\n<|assistant|>\n"  # the tiny model's template, nothing added
    assert ids.count(tokenizer.convert_tokens_to_ids("<|assistant|>")) == 1


def test_a_text_prompt_is_encoded_as_training_text(tokenizer: Any) -> None:
    ids = writer(tokenizer, chat=False).prompt_ids("one two")
    assert ids == tokenizer("one two")["input_ids"]
    assert "<|user|>" not in tokenizer.decode(ids)


def test_completion_stops_at_eos(tokenizer: Any) -> None:
    eos = tokenizer.eos_token_id
    words = tokenizer("three four", add_special_tokens=False)["input_ids"]
    assert decode_until_eos(tokenizer, [*words, eos, *words], eos).strip() == "three four"
    assert decode_until_eos(tokenizer, words, None).strip() == "three four"


def test_cadence_without_an_eval_split() -> None:
    assert every_steps(eval_steps=5, save_steps=100) == 5
    assert every_steps(eval_steps=None, save_steps=100) == 100
    assert every_steps(eval_steps=None, save_steps=None) is None


class _State:
    def __init__(self, step: int) -> None:
        self.global_step = step


def test_steps_are_sampled_once_on_the_cadence(tokenizer: Any) -> None:
    sampled: list[int] = []
    w = SampleWriter(Path("unused"), ["x"], 4, tokenizer=tokenizer, chat=False, every_steps=3)
    w.sample = sampled.append  # type: ignore[method-assign,assignment]
    for step in range(1, 8):
        w.on_step_end(None, _State(step), None)
        w.on_evaluate(None, _State(step), None)  # evaluations do not sample on a step cadence
    assert sampled == [3, 6]


def test_the_prompts_are_one_batch_in_lockstep_and_answer_as_generate_does(
    tiny_dir: Path, tokenizer: Any
) -> None:
    """Issue 49: samples on sharded weights took one forward of the whole sequence per prompt and token
    (8 prompts x 64 tokens: 512 gathers of the weights). Now the prompts are one left-padded batch with
    the KV cache: `max_new_tokens` forwards in all, each prompt's tokens those of its own greedy generate."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.samples import greedy_in_step

    model = AutoModelForCausalLM.from_pretrained(tiny_dir / "model", dtype=torch.float32).eval()
    prompts = [
        tokenizer(p)["input_ids"] for p in ("a b c d e", "one", "the black dog chases the", "four five")
    ]
    assert len({len(p) for p in prompts}) >= 3  # the batch pads
    forwards = [0]
    model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    with torch.no_grad():
        batched = greedy_in_step(model, prompts, 6, pad=tokenizer.eos_token_id, device="cpu")
    assert forwards[0] == 6
    for prompt, tokens in zip(prompts, batched, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            alone = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=6,
                min_new_tokens=6,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )
        assert tokens == alone[0, len(prompt) :].tolist()
