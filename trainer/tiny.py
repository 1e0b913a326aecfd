"""Build a tiny offline model and datasets for tests, examples and benchmarks, deterministically.

    python -m trainer.tiny --out examples/tiny            # a few seconds, a few hundred KB
    python -m trainer.tiny --out /tmp/small --size small  # a larger model for benchmarks

Writes:
    OUT/model/                 random Llama-style model (config + safetensors) and a BPE fast tokenizer
                               with a chat template
    OUT/model-no-weights/      the same without weights (a failure case)
    OUT/data/train.jsonl       `text`: patterned sentences of mixed length; loss falls quickly on it
    OUT/data/eval.jsonl        more of the same
    OUT/data/no_text_field.jsonl  the train rows with the text under `body` (a failure case)
    OUT/chat/train.jsonl       `messages`: user/assistant turns built from the same patterns
    OUT/chat/eval.jsonl
    OUT/preference/{train,eval}.jsonl  `prompt`/`chosen`/`rejected` text: count on (chosen) or not (rejected);
                               a DPO run's reward margin grows on it within a few steps
    OUT/preference_chat/train.jsonl    the same as conversations
    OUT/unpaired/train.jsonl   `prompt`/`completion`/`label` (KTO): half right (true), half wrong (false)
    OUT/prompt_completion/train.jsonl  `prompt`/`completion`: loss_on completion trains on the answer only
    OUT/model-plain-template/  the model with a chat template without {% generation %} markers
    OUT/model-serve/           a model for serving: the same tokenizer and chat template, head_dim 64 (vLLM's
                               CPU attention refuses the tiny model's 16), 2 layers, hidden 128

Everything derives from `--seed`, so two builds give the same files.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path
from typing import Any

SIZES: dict[str, dict[str, int]] = {
    # hidden 64, 2 layers: ~150k parameters, about 600 KB of float32 safetensors.
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
    },
    # For benchmarks, where per-step overhead should not dominate the measurement.
    "small": {
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "vocab_size": 1024,
    },
    # For the generation engine (vLLM): its CPU attention needs head_dim >= 32, the tiny model's is 16.
    # hidden 128 over 2 heads is head_dim 64; ~440k parameters, under 2 MB of float32 safetensors.
    "serve": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "vocab_size": 512,
    },
}
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
# Assistant turns are wrapped in {% generation %} markers (what `loss_on: assistant` masks by): the
# rendered text is the same as without them, and the turn's </s> is inside, so the model learns to stop.
# (transformers renders with trim_blocks: a newline right after a block tag would vanish, hence '\n'.)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}</s>{% endgeneration %}"
    "{% else %}{{ message['content'] }}</s>{% endif %}{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# The same without the markers: a template that cannot say which tokens are the assistant's.
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# A larger init than Llama's 0.02 so that frozen random weights still give LoRA a useful range of
# logits: with 0.02 the output layer is nearly flat and an adapter can barely move the loss.
INITIALIZER_RANGE = 0.1

NUMBERS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
]
COLORS = ["red", "green", "blue", "yellow", "black", "white"]
ANIMALS = ["cat", "dog", "fox", "bird", "fish", "horse"]
VERBS = ["sees", "likes", "chases", "follows", "finds"]
NAMES = ["alice", "bob", "carol", "dave", "erin", "frank"]


def sentence(rng: random.Random) -> str:
    """One patterned sentence; each kind is predictable once its first words are seen."""
    kind = rng.randrange(4)
    if kind == 0:
        start = rng.randrange(len(NUMBERS) - 4)
        return " ".join(NUMBERS[start : start + rng.randint(3, len(NUMBERS) - start)]) + "."
    if kind == 1:
        return (
            f"the {rng.choice(COLORS)} {rng.choice(ANIMALS)} {rng.choice(VERBS)} the {rng.choice(ANIMALS)}."
        )
    if kind == 2:
        name = rng.choice(NAMES)
        return f"{name} has {rng.choice(NUMBERS)} {rng.choice(ANIMALS)}s and {name} is happy."
    letters = "abcdefghijklmnop"
    start = rng.randrange(8)
    return " ".join(letters[start : start + rng.randint(4, 8)]) + "."


def paragraph(rng: random.Random) -> str:
    # Mixed lengths: mostly short rows, a tail of long ones, as real SFT data has.
    n = min(24, 1 + int(rng.expovariate(1 / 4)))
    return " ".join(sentence(rng) for _ in range(n))


def chat(rng: random.Random) -> list[dict[str, str]]:
    start = rng.randrange(len(NUMBERS) - 4)
    count = rng.randint(3, len(NUMBERS) - start)
    name = rng.choice(NAMES)
    pairs = [
        (f"count from {NUMBERS[start]}.", " ".join(NUMBERS[start : start + count]) + "."),
        (f"what does {name} have?", f"{name} has {rng.choice(NUMBERS)} {rng.choice(ANIMALS)}s."),
        ("describe an animal.", sentence(rng)),
    ]
    messages = [{"role": "system", "content": "you are a tiny helpful model."}]
    for user, assistant in rng.sample(pairs, rng.randint(1, 3)):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return messages


def count_task(rng: random.Random) -> tuple[str, str, str]:
    """(prompt, right answer, wrong answer): counting up from a number, against a shuffled count."""
    start = rng.randrange(len(NUMBERS) - 4)
    count = rng.randint(3, min(6, len(NUMBERS) - start))
    right = NUMBERS[start : start + count]
    wrong = [rng.choice(NUMBERS) for _ in right]
    while wrong == right:
        wrong = [rng.choice(NUMBERS) for _ in right]
    # The answers start with a space, so the prompt ends where a token does (TRL tokenizes the prompt
    # and prompt + answer, and warns when the prompt's last token merges with the answer's first).
    return f"count from {NUMBERS[start]}.", " " + " ".join(right) + ".", " " + " ".join(wrong) + "."


def preference_rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """prompt/chosen/rejected text: the chosen answer counts right, the rejected one does not."""
    rows = []
    for _ in range(n):
        prompt, right, wrong = count_task(rng)
        rows.append({"prompt": prompt, "chosen": right, "rejected": wrong})
    return rows


def preference_chat_rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """The same preferences as conversations: a user turn, then one assistant turn each."""
    rows = []
    for _ in range(n):
        prompt, right, wrong = count_task(rng)
        rows.append(
            {
                "prompt": [{"role": "user", "content": prompt}],
                "chosen": [{"role": "assistant", "content": right.strip()}],
                "rejected": [{"role": "assistant", "content": wrong.strip()}],
            }
        )
    return rows


def unpaired_rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """prompt/completion/label for KTO: half right answers (true), half wrong ones (false)."""
    rows = []
    for i in range(n):
        prompt, right, wrong = count_task(rng)
        good = i % 2 == 0
        rows.append({"prompt": prompt, "completion": right if good else wrong, "label": good})
    return rows


def prompt_completion_rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    rows = []
    for _ in range(n):
        prompt, right, _ = count_task(rng)
        rows.append({"prompt": prompt, "completion": right})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")


def build_tokenizer(corpus: list[str], vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",  # noqa: S106 (a token, not a password)
        eos_token="</s>",  # noqa: S106
        pad_token="<pad>",  # noqa: S106
        additional_special_tokens=SPECIAL_TOKENS[3:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def build_model(tokenizer: Any, size: str, seed: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape: dict[str, Any] = {**SIZES[size], "vocab_size": len(tokenizer)}
    config = LlamaConfig(
        **shape,
        max_position_embeddings=4096,
        initializer_range=INITIALIZER_RANGE,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def build(out: Path, size: str = "tiny", seed: int = 0, train_rows: int = 2000, eval_rows: int = 64) -> None:
    rng = random.Random(seed)  # noqa: S311 (test data, not secrets)
    train = [{"text": paragraph(rng)} for _ in range(train_rows)]
    eval_ = [{"text": paragraph(rng)} for _ in range(eval_rows)]
    chat_train = [{"messages": chat(rng)} for _ in range(train_rows // 2)]
    chat_eval = [{"messages": chat(rng)} for _ in range(eval_rows)]

    write_jsonl(out / "data" / "train.jsonl", train)
    write_jsonl(out / "data" / "eval.jsonl", eval_)
    write_jsonl(out / "data" / "no_text_field.jsonl", [{"body": r["text"]} for r in train[:200]])
    write_jsonl(out / "chat" / "train.jsonl", chat_train)
    write_jsonl(out / "chat" / "eval.jsonl", chat_eval)

    # Their own random stream: the text and chat rows above (and so the tokenizer and model) stay as
    # they were before these sets existed.
    prefs = random.Random(seed + 1)  # noqa: S311
    write_jsonl(out / "preference" / "train.jsonl", preference_rows(prefs, 256))
    write_jsonl(out / "preference" / "eval.jsonl", preference_rows(prefs, 32))
    write_jsonl(out / "preference_chat" / "train.jsonl", preference_chat_rows(prefs, 256))
    write_jsonl(out / "unpaired" / "train.jsonl", unpaired_rows(prefs, 256))
    write_jsonl(out / "prompt_completion" / "train.jsonl", prompt_completion_rows(prefs, 256))

    corpus = [r["text"] for r in train] + [m["content"] for row in chat_train for m in row["messages"]]
    tokenizer = build_tokenizer(corpus, SIZES[size]["vocab_size"])
    model = build_model(tokenizer, size, seed)

    model_dir = out / "model"
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model.save_pretrained(str(model_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(model_dir))

    # A chat model whose template cannot mark assistant turns (loss_on: assistant refuses it).
    plain = out / "model-plain-template"
    if plain.exists():
        shutil.rmtree(plain)
    tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    model.save_pretrained(str(plain), safe_serialization=True)
    tokenizer.save_pretrained(str(plain))
    tokenizer.chat_template = CHAT_TEMPLATE

    # The serving model: built after the others from its own seeded init, so they are as they were.
    serve = out / "model-serve"
    if serve.exists():
        shutil.rmtree(serve)
    build_model(tokenizer, "serve", seed).save_pretrained(str(serve), safe_serialization=True)
    tokenizer.save_pretrained(str(serve))

    no_weights = out / "model-no-weights"
    if no_weights.exists():
        shutil.rmtree(no_weights)
    shutil.copytree(model_dir, no_weights, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainer.tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="Folder to write (created if missing).")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train_rows", type=int, default=2000)
    ns = parser.parse_args(argv)
    build(ns.out, size=ns.size, seed=ns.seed, train_rows=ns.train_rows)
    print(f"wrote {ns.out}/model, {ns.out}/model-serve, {ns.out}/data, {ns.out}/chat")


if __name__ == "__main__":
    main()
