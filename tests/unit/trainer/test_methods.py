"""The trainers ftq builds for each method (trainer/train.py `training_config`, `build_trainer`) on the tiny
model, in process: which tokens carry the loss (`loss_on`), and which reference a DPO run has."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ftq.contract.spec import JobSpec
from trainer.data import load_splits, trl_rows
from trainer.errors import ModelError, SpecError
from trainer.model import load_model, load_tokenizer, lora_config
from trainer.train import build_trainer, check_assistant_template, check_loss_on, training_config

IGNORE = -100


def job(tiny_dir: Path, dataset: str, *, lora: bool = True, model: str = "model", **training: Any) -> JobSpec:
    body: dict[str, Any] = {
        "model": {"name_or_path": str(tiny_dir / model), "attn_implementation": "sdpa"},
        "dataset": {"name_or_path": str(dataset)},
        "training": {
            "max_steps": 1,
            "max_seq_len": 128,
            "mixed_precision": "no",
            "per_device_train_batch_size": 2,
            "save_steps": None,
            **training,
        },
        "resources": {"device": "cpu"},
    }
    if lora:
        body["lora"] = {"r": 4, "alpha": 8, "dropout": 0.0}
    return JobSpec.model_validate(body)


def trainer_for(spec: JobSpec, tmp_path: Path) -> Any:
    import torch

    _, splits = load_splits(spec.dataset, seed=0, method=str(spec.training.method))
    check_loss_on(spec, splits.format)
    tokenizer = load_tokenizer(spec.model)
    if spec.training.loss_on == "assistant":
        check_assistant_template(tokenizer, spec.model.name_or_path)
    rows = trl_rows(splits.train.select(range(8)), spec.dataset, splits.format, tokenizer)
    config = training_config(spec, tmp_path / "run", has_eval=False, fmt=splits.format)
    model = load_model(spec, torch.float32, "sdpa")
    peft = None
    if spec.lora is not None:
        peft = lora_config(spec.lora, "SEQ_CLS" if spec.training.method == "reward" else "CAUSAL_LM")
    return build_trainer(spec, model, config, rows, None, tokenizer, peft, callbacks=[])


def collate(trainer: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(trainer.data_collator(rows))


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_loss_on_completion_masks_the_prompt_in_the_collated_batch(tiny_dir: Path, tmp_path: Path) -> None:
    spec = job(tiny_dir, str(tiny_dir / "prompt_completion" / "train.jsonl"), loss_on="completion")
    trainer = trainer_for(spec, tmp_path)
    tok = trainer.processing_class
    source = [
        json.loads(ln) for ln in (tiny_dir / "prompt_completion" / "train.jsonl").read_text().splitlines()[:2]
    ]
    ds = trainer.train_dataset
    batch = collate(trainer, [ds[0], ds[1]])
    for i, row in enumerate(source):
        labels = batch["labels"][i].tolist()
        ids = batch["input_ids"][i].tolist()
        prompt_len = len(tok(row["prompt"])["input_ids"])
        assert prompt_len > 0 and labels[:prompt_len] == [IGNORE] * prompt_len  # the prompt carries no loss
        assert tok.decode(ids[:prompt_len]) == row["prompt"]
        kept = [t for t in labels if t != IGNORE]
        assert tok.decode(kept) == row["completion"] + "</s>"  # the completion, and the EOS TRL appends

    all_tokens = trainer_for(job(tiny_dir, str(tiny_dir / "prompt_completion" / "train.jsonl")), tmp_path)
    unmasked = collate(all_tokens, [all_tokens.train_dataset[0]])
    assert IGNORE not in unmasked["labels"][0].tolist()  # loss_on: all trains on the prompt too


def assistant_masked_loss(
    trainer: Any, spec: JobSpec, conversation: list[dict[str, str]]
) -> tuple[float, Any]:
    """The loss of one conversation as the trainer's collator labels it, and the labels."""
    import torch

    rows = trl_rows_from(conversation, spec, trainer)
    batch = collate(trainer, rows)
    model = trainer.model
    model.eval()
    with torch.no_grad():
        out = model(
            input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), labels=batch["labels"]
        )
    return float(out.loss), batch["labels"][0]


def trl_rows_from(conversation: list[dict[str, str]], spec: JobSpec, trainer: Any) -> list[dict[str, Any]]:
    """One conversation through TRL's own tokenization (the trainer's dataset preparation)."""
    from datasets import Dataset

    prepared = trainer._prepare_dataset(
        Dataset.from_list([{"messages": conversation}]),
        trainer.processing_class,
        trainer.args,
        packing=False,
        formatting_func=None,
        dataset_name="train",
    )
    return [prepared[0]]


def test_loss_on_assistant_masks_every_other_turn_and_they_carry_no_loss(
    tiny_dir: Path, tmp_path: Path
) -> None:
    spec = job(tiny_dir, str(tiny_dir / "chat" / "train.jsonl"), loss_on="assistant")
    trainer = trainer_for(spec, tmp_path)
    tok = trainer.processing_class

    # The system and user turns are -100 in the collated labels; the assistant's answer and its </s> are not.
    conv = [
        {"role": "system", "content": "you are a tiny helpful model."},
        {"role": "user", "content": "count from one."},
        {"role": "assistant", "content": "one two three."},
        {"role": "user", "content": "count from four."},
    ]
    loss, labels = assistant_masked_loss(trainer, spec, conv)
    kept = [int(t) for t in labels.tolist() if t != IGNORE]
    assert tok.decode(kept) == "one two three.</s>"

    # A masked turn really carries no loss: change the last user turn (nothing after it reads it, the model
    # being causal), and the loss is the same to the last bit; trained on all tokens, it would change.
    changed = [*conv[:3], {"role": "user", "content": "count from nine."}]
    assert tok.apply_chat_template(changed, tokenize=True) != tok.apply_chat_template(conv, tokenize=True)
    loss_changed, _ = assistant_masked_loss(trainer, spec, changed)
    assert loss_changed == loss

    all_spec = job(tiny_dir, str(tiny_dir / "chat" / "train.jsonl"))
    everything = trainer_for(all_spec, tmp_path)
    everything.model.load_state_dict(trainer.model.state_dict())
    full, full_labels = assistant_masked_loss(everything, all_spec, conv)
    full_changed, _ = assistant_masked_loss(everything, all_spec, changed)
    assert IGNORE not in full_labels.tolist() and full_changed != full


def test_assistant_loss_with_a_template_that_cannot_mark_turns_is_refused(tiny_dir: Path) -> None:
    tokenizer = load_tokenizer(job(tiny_dir, "x.jsonl", model="model-plain-template").model)
    with pytest.raises(ModelError) as info:
        check_assistant_template(tokenizer, "model-plain-template")
    assert "{% generation %}" in info.value.message and "loss_on: all" in info.value.message
    tokenizer.chat_template = None
    with pytest.raises(ModelError, match="has no chat template"):
        check_assistant_template(tokenizer, "m")


def test_loss_on_that_the_data_cannot_mask_is_a_spec_error(tiny_dir: Path) -> None:
    spec = job(tiny_dir, str(tiny_dir / "data" / "train.jsonl"), loss_on="completion")
    with pytest.raises(SpecError, match="loss_on completion needs prompt_completion data"):
        check_loss_on(spec, "text")


def count_reference_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every model TRL's DPOTrainer loads itself (the reference, when it makes one)."""
    import trl.trainer.dpo_trainer as dpo_trainer

    loads: list[str] = []
    real = dpo_trainer.create_model_from_path

    def counting(path: str, *args: Any, **kwargs: Any) -> Any:
        loads.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(dpo_trainer, "create_model_from_path", counting)
    return loads


def test_dpo_with_lora_loads_no_reference_copy(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads = count_reference_loads(monkeypatch)
    trainer = trainer_for(job(tiny_dir, str(tiny_dir / "preference" / "train.jsonl"), method="dpo"), tmp_path)
    assert type(trainer).__name__ == "DPOTrainer"
    assert trainer.ref_model is None and loads == []  # the reference is the base with the adapter disabled


def test_full_fine_tuning_dpo_loads_one_reference_copy(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads = count_reference_loads(monkeypatch)
    spec = job(tiny_dir, str(tiny_dir / "preference" / "train.jsonl"), lora=False, method="dpo")
    trainer = trainer_for(spec, tmp_path)
    assert trainer.ref_model is not None and len(loads) == 1
    assert trainer.ref_model is not trainer.model and not trainer.ref_model.training  # evaluation mode


def test_each_method_gets_its_trl_config(tiny_dir: Path, tmp_path: Path) -> None:
    prefs = str(tiny_dir / "preference" / "train.jsonl")
    dpo = training_config(
        job(tiny_dir, prefs, method="dpo", dpo={"beta": 0.3, "loss_type": "ipo"}), tmp_path, has_eval=False
    )
    assert type(dpo).__name__ == "DPOConfig" and dpo.beta == 0.3 and dpo.loss_type == ["ipo"]
    assert dpo.max_length == 128 and dpo.learning_rate == 5e-5 and dpo.bf16 is False
    kto = training_config(
        job(tiny_dir, prefs, method="kto", kto={"undesirable_weight": 2.0}), tmp_path, has_eval=False
    )
    assert type(kto).__name__ == "KTOConfig" and kto.undesirable_weight == 2.0 and kto.loss_type == "kto"
    reward = training_config(job(tiny_dir, prefs, method="reward"), tmp_path, has_eval=False)
    assert type(reward).__name__ == "RewardConfig" and reward.center_rewards_coefficient is None
    sft = training_config(job(tiny_dir, prefs), tmp_path, has_eval=False, fmt="prompt_completion")
    assert type(sft).__name__ == "SFTConfig" and sft.completion_only_loss is False  # loss_on: all
    sft = training_config(
        job(tiny_dir, prefs, loss_on="completion"), tmp_path, has_eval=False, fmt="prompt_completion"
    )
    assert sft.completion_only_loss is True and sft.assistant_only_loss is False


WEIGHTED: list[dict[str, Any]] = [
    {"role": "system", "content": "you are a tiny helpful model."},
    {"role": "user", "content": "count from one."},
    {"role": "assistant", "content": "one two four.", "weight": 0},
    {"role": "user", "content": "again."},
    {"role": "assistant", "content": "one two three.", "weight": 1},
]


def openai_labels(trainer: Any, spec: JobSpec, conversations: list[list[dict[str, Any]]]) -> list[list[int]]:
    """OpenAI chat rows through trl_rows (ftq's tokenization and mask) and the trainer's preparation (TRL's
    labels), as they reach the loss."""
    from datasets import Dataset

    rows = trl_rows(
        Dataset.from_list([{"messages": c} for c in conversations]),
        spec.dataset,
        "messages",
        trainer.processing_class,
        loss_on=str(spec.training.loss_on),
        model_name="tiny",
    )
    prepared = trainer._prepare_dataset(
        rows,
        trainer.processing_class,
        trainer.args,
        packing=False,
        formatting_func=None,
        dataset_name="train",
    )
    return [list(r["labels"]) for r in prepared]


def test_a_weight_of_zero_takes_an_assistant_turn_out_of_the_loss(tiny_dir: Path, tmp_path: Path) -> None:
    spec = job(tiny_dir, str(tiny_dir / "chat" / "train.jsonl"), loss_on="assistant")
    trainer = trainer_for(spec, tmp_path)
    tok = trainer.processing_class
    both = [{**m, "weight": 1} if m["role"] == "assistant" else m for m in WEIGHTED]
    weighted, unweighted = openai_labels(trainer, spec, [WEIGHTED, both])
    kept = [t for t in weighted if t != IGNORE]
    assert tok.decode(kept) == "one two three.</s>"  # the weight-0 answer carries no loss
    assert tok.decode([t for t in unweighted if t != IGNORE]) == "one two four.</s>one two three.</s>"
    assert len(weighted) == len(unweighted) and weighted != unweighted

    # loss_on: all trains on every token but the weight-0 turn's.
    all_spec = job(tiny_dir, str(tiny_dir / "chat" / "train.jsonl"))
    (every,) = openai_labels(trainer_for(all_spec, tmp_path), all_spec, [WEIGHTED])
    plain = [{k: v for k, v in m.items() if k != "weight"} for m in WEIGHTED]
    ids = list(tok.apply_chat_template(plain, tokenize=True, return_dict=True)["input_ids"])
    assert len(ids) == len(every)
    assert tok.decode([i for i, t in zip(ids, every, strict=True) if t == IGNORE]) == "one two four.</s>"
    assert tok.decode([t for t in every if t != IGNORE]).startswith("<|system|>")
    # A row whose only answer has weight 0 has nothing to learn: dropped.
    assert openai_labels(trainer, spec, [WEIGHTED[:3]]) == []


def test_tool_calls_the_chat_template_cannot_render_are_an_error_naming_the_line(
    tiny_dir: Path, tmp_path: Path
) -> None:
    from datasets import Dataset

    from trainer.errors import DatasetError

    call = {"id": "c1", "type": "function", "function": {"name": "count_up", "arguments": '{"n": 3}'}}
    rows = [
        {"messages": WEIGHTED},
        {"messages": [*WEIGHTED[:2], {"role": "assistant", "content": None, "tool_calls": [call]}]},
    ]
    spec = job(tiny_dir, str(tiny_dir / "chat" / "train.jsonl"))
    tokenizer = load_tokenizer(spec.model)
    with pytest.raises(DatasetError) as info:
        trl_rows(Dataset.from_list(rows), spec.dataset, "messages", tokenizer, model_name="tiny")
    assert "line 2: the chat template of tiny cannot render tool_calls" in info.value.message
    # A template that renders them takes the row, with the call's arguments as an object.
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {% if m.get('tool_calls') %}{% generation %}"
        "{{ m['tool_calls'][0]['function']['name'] }}({{ m['tool_calls'][0]['function']['arguments']['n'] }})"
        "</s>{% endgeneration %}{% elif m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}</s>"
        "{% endgeneration %}{% else %}{{ m['content'] }}</s>{% endif %}{% endfor %}"
    )
    out = trl_rows(Dataset.from_list(rows), spec.dataset, "messages", tokenizer, model_name="tiny")
    assert len(out) == 2 and "count_up(3)" in tokenizer.decode(out[1]["input_ids"])


def test_openai_preference_rows_become_conversational_prompt_chosen_rejected(tiny_dir: Path) -> None:
    from datasets import Dataset

    row = {
        "input": {"messages": [{"role": "user", "content": "count from one."}], "tools": []},
        "preferred_output": [{"role": "assistant", "content": "one two three."}],
        "non_preferred_output": [{"role": "assistant", "content": "three two one."}],
    }
    spec = job(tiny_dir, str(tiny_dir / "chat" / "train.jsonl"), lora=True)
    tokenizer = load_tokenizer(spec.model)
    out = trl_rows(Dataset.from_list([row, row]), spec.dataset, "openai_preference", tokenizer)
    assert out.column_names == ["prompt", "chosen", "rejected"] and len(out) == 2
    assert out[0]["prompt"] == [{"role": "user", "content": "count from one."}]
    assert out[0]["chosen"] == [{"role": "assistant", "content": "one two three."}]
    assert out[0]["rejected"] == [{"role": "assistant", "content": "three two one."}]
