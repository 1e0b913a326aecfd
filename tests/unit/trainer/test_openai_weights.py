"""OpenAI chat rows with a `weight` on assistant turns (issue 49): ftq tokenizes them with their labels
(trainer.data.openai_chat_rows), an assistant turn with weight 0 is context that carries no loss, and TRL's
trainer takes the tokenized rows under `loss_on: assistant` (it used to refuse them as not conversational)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from ftq.contract.spec import JobSpec
from trainer.data import trl_rows
from trainer.model import load_model, load_tokenizer, lora_config
from trainer.train import build_trainer, training_config

IGNORE = -100
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "you are a tiny helpful model."},
    {"role": "user", "content": "count from one."},
    {"role": "assistant", "content": "one two four.", "weight": 0},
    {"role": "user", "content": "again."},
    {"role": "assistant", "content": "one two three.", "weight": 1},
]


def spec_for(tiny_dir: Path, loss_on: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "model": {"name_or_path": str(tiny_dir / "model"), "attn_implementation": "sdpa"},
            "dataset": {"name_or_path": str(tiny_dir / "chat" / "train.jsonl")},
            "training": {
                "max_steps": 1,
                "max_seq_len": 128,
                "mixed_precision": "no",
                "per_device_train_batch_size": 2,
                "save_steps": None,
                "loss_on": loss_on,
            },
            "lora": {"r": 4, "alpha": 8, "dropout": 0.0},
            "resources": {"device": "cpu"},
        }
    )


def rows(spec: JobSpec, tokenizer: Any, conversations: list[list[dict[str, Any]]]) -> Any:
    from datasets import Dataset

    return trl_rows(
        Dataset.from_list([{"messages": c} for c in conversations]),
        spec.dataset,
        "messages",
        tokenizer,
        loss_on=str(spec.training.loss_on),
        model_name="tiny",
    )


def assistant_spans(tokenizer: Any) -> tuple[list[int], list[range]]:
    """The conversation's token ids as the chat template renders it without weights, and the positions of
    each assistant turn (the template's {% generation %} marks)."""
    plain = [{k: v for k, v in m.items() if k != "weight"} for m in CONVERSATION]
    out = tokenizer.apply_chat_template(
        plain, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    mask = list(out["assistant_masks"])
    spans, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            spans.append(range(start, i))
            start = None
    return list(out["input_ids"]), spans


@pytest.mark.parametrize("loss_on", ["assistant", "all"])
def test_weights_0_then_1_leave_only_the_second_answer_in_the_loss(tiny_dir: Path, loss_on: str) -> None:
    spec = spec_for(tiny_dir, loss_on)
    tok = load_tokenizer(spec.model)
    ids, (first, second) = assistant_spans(tok)
    (row,) = rows(spec, tok, [CONVERSATION])
    assert row["input_ids"] == ids and len(row["labels"]) == len(ids)
    learned = {i for i, label in enumerate(row["labels"]) if label != IGNORE}
    # Where a token carries loss, its label is the token itself.
    assert all(row["labels"][i] == ids[i] for i in learned)
    assert not learned & set(first)  # the weight-0 answer is context only
    assert set(second) <= learned
    if loss_on == "assistant":
        assert learned == set(second)
        assert tok.decode([ids[i] for i in sorted(learned)]) == "one two three.</s>"
    else:  # every token but the weight-0 answer's
        assert learned == set(range(len(ids))) - set(first)
    assert tok.decode([ids[i] for i in first]) == "one two four.</s>"


def test_the_log_counts_weight_0_turns_and_the_rows_left_with_nothing_to_learn(
    tiny_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = spec_for(tiny_dir, "assistant")
    tok = load_tokenizer(spec.model)
    none_learned = [{**m, "weight": 0} if m["role"] == "assistant" else m for m in CONVERSATION]
    all_learned = [{**m, "weight": 1} if m["role"] == "assistant" else m for m in CONVERSATION]
    unweighted = [{k: v for k, v in m.items() if k != "weight"} for m in CONVERSATION]
    data = [CONVERSATION, none_learned, all_learned, unweighted, none_learned[:3]]
    with caplog.at_level(logging.INFO, logger="trainer"):
        out = rows(spec, tok, data)
    # 1 + 2 + 1 turns with weight 0; the rows whose answers all have weight 0 (2nd and 5th) are dropped.
    assert "4 assistant turn(s) with weight 0 left out of the loss; 2 row(s) with nothing" in caplog.text
    assert len(out) == 3 and all(any(label != IGNORE for label in r["labels"]) for r in out)
    # Under loss_on: all the system and user turns are still learned: no row is dropped.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trainer"):
        assert len(rows(spec_for(tiny_dir, "all"), tok, data)) == 5
    assert "4 assistant turn(s) with weight 0 left out of the loss; 0 row(s) with nothing" in caplog.text


def test_the_sft_trainer_takes_weighted_rows_under_loss_on_assistant(tiny_dir: Path, tmp_path: Path) -> None:
    """Issue 49: TRL refused ftq's tokenized rows with assistant_only_loss set ('the dataset is not
    conversational'). The trainer is built, its labels are ftq's, and one step trains."""
    import torch

    spec = spec_for(tiny_dir, "assistant")
    tok = load_tokenizer(spec.model)
    second_only = [m for m in CONVERSATION if m.get("weight") != 0]
    train = rows(spec, tok, [CONVERSATION, second_only])
    config = training_config(spec, tmp_path / "run", has_eval=True, fmt="messages")
    assert config.assistant_only_loss is True  # what the spec asks; ftq's labels carry it
    model = load_model(spec, torch.float32, "sdpa")
    assert spec.lora is not None
    trainer = build_trainer(spec, model, config, train, train, tok, lora_config(spec.lora, "CAUSAL_LM"), [])
    ids, (_, second) = assistant_spans(tok)
    prepared = trainer.train_dataset[0]
    assert prepared["input_ids"] == ids and prepared["labels"] == train[0]["labels"]
    batch = trainer.data_collator([trainer.train_dataset[0], trainer.train_dataset[1]])
    learned = [i for i, label in enumerate(batch["labels"][0].tolist()) if label != IGNORE]
    assert learned == list(second)
    assert trainer.train().training_loss > 0


def test_an_eval_split_without_weights_is_labelled_as_its_weighted_train_split(tiny_dir: Path) -> None:
    """A validation file of plain chat rows beside a weighted training file: tokenized by ftq too
    (prepare_data passes `tokenize`), so that its loss covers the same tokens (here the answers only)."""
    from datasets import Dataset

    spec = spec_for(tiny_dir, "assistant")
    tok = load_tokenizer(spec.model)
    plain = [{k: v for k, v in m.items() if k != "weight"} for m in CONVERSATION]
    ds = Dataset.from_list([{"messages": plain}])
    assert rows(spec, tok, [plain]).column_names == ["messages"]  # left to TRL on its own
    (row,) = trl_rows(ds, spec.dataset, "messages", tok, loss_on="assistant", tokenize=True)
    ids, (first, second) = assistant_spans(tok)
    assert row["input_ids"] == ids
    assert [i for i, label in enumerate(row["labels"]) if label != IGNORE] == [*first, *second]
