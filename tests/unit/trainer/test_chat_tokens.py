"""Chat rows reach TRL as messages (trainer/data.py `trl_rows`): TRL 1.x tokenizes them once, with the
chat template alone deciding BOS and EOS. Checked on TRL's real dataset preparation (an SFTTrainer built
from ftq's own SFTConfig) with two real fast tokenizers: a Llama-style one whose template starts with
BOS and whose encoder also adds BOS, and one whose template ends every turn with EOS and a newline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ftq.contract.spec import DatasetFormat, DatasetSpec, JobSpec
from trainer.data import load_splits, trl_rows
from trainer.tiny import CHAT_TEMPLATE, SPECIAL_TOKENS
from trainer.train import sft_config

LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}[INST] {{ message['content'] }} [/INST]"
    "{% else %} {{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
CONVERSATIONS = [
    [
        {"role": "user", "content": "count from one."},
        {"role": "assistant", "content": "one two three."},
    ],
    [
        {"role": "user", "content": "what does bob have?"},
        {"role": "assistant", "content": "bob has two cats."},
        {"role": "user", "content": "and alice?"},
        {"role": "assistant", "content": "alice has a dog."},
    ],
]


def build_tokenizer(template: str, bos_on_encode: bool) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [m["content"] for conv in CONVERSATIONS for m in conv] + ["[INST] [/INST] user assistant"]
    tok.train_from_iterator(
        corpus,
        trainer=trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    if bos_on_encode:  # as Llama's tokenizers do: every encode starts with <s>
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    # No pad token, as Llama ships: the pad is EOS, so EOS must survive as a real token.
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
        chat_template=template,
    )


def trl_input_ids(tokenizer: Any, tmp_path: Path) -> list[list[int]]:
    """The token ids TRL trains on, after its own preparation of ftq's rows."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import SFTTrainer

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": m, "source": "x"}) + "\n" for m in CONVERSATIONS))
    spec = JobSpec.model_validate(
        {
            "model": {"name_or_path": str(tmp_path)},
            "dataset": {"name_or_path": str(data)},
            "training": {"max_steps": 1, "max_seq_len": 256, "packing": False, "mixed_precision": "no"},
            "resources": {"device": "cpu"},
        }
    )
    _, splits = load_splits(spec.dataset, seed=0)
    assert splits.format == "messages"
    rows = trl_rows(splits.train, spec.dataset, splits.format, tokenizer)
    model = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=len(tokenizer),
        )
    )
    trainer = SFTTrainer(
        model=model,
        args=sft_config(spec, tmp_path / "run", has_eval=False),
        train_dataset=rows,
        processing_class=tokenizer,
    )
    prepared: Any = trainer.train_dataset  # TRL's own preparation of the rows
    return [list(ids) for ids in prepared["input_ids"]]


def test_llama_template_gives_one_bos_and_one_eos_per_answer(tmp_path: Path) -> None:
    tok = build_tokenizer(LLAMA_TEMPLATE, bos_on_encode=True)
    bos, eos = tok.bos_token_id, tok.eos_token_id
    for ids, conv in zip(trl_input_ids(tok, tmp_path), CONVERSATIONS, strict=True):
        answers = sum(m["role"] == "assistant" for m in conv)
        assert ids[0] == bos and ids.count(bos) == 1, tok.convert_ids_to_tokens(ids)
        assert ids.count(eos) == answers and ids[-1] == eos, tok.convert_ids_to_tokens(ids)
        assert ids == tok.apply_chat_template(conv, tokenize=True, return_dict=True)["input_ids"]


def test_template_ending_in_a_newline_gets_no_extra_eos(tmp_path: Path) -> None:
    tok = build_tokenizer(CHAT_TEMPLATE, bos_on_encode=False)  # the tiny model's: "...</s>\n" per turn
    eos = tok.eos_token_id
    newline = tok.convert_tokens_to_ids(tok.tokenize("\n"))
    for ids, conv in zip(trl_input_ids(tok, tmp_path), CONVERSATIONS, strict=True):
        assert ids.count(eos) == len(conv), tok.convert_ids_to_tokens(ids)
        assert ids[-len(newline) :] == newline  # the template's last newline ends the row, nothing after
        assert tok.bos_token_id not in ids  # this template has no BOS, and nothing adds one


def test_text_rows_keep_only_the_text_column(tmp_path: Path) -> None:
    tok = build_tokenizer(LLAMA_TEMPLATE, bos_on_encode=True)
    data = tmp_path / "text.jsonl"
    data.write_text(json.dumps({"body": "one two three.", "other": 1}) + "\n")
    spec = DatasetSpec(name_or_path=str(data), text_field="body")
    _, splits = load_splits(spec, seed=0)
    rows = trl_rows(splits.train, spec, splits.format, tok)
    assert rows.column_names == ["text"] and rows["text"] == ["one two three."]


@pytest.mark.parametrize("field", ["messages", "conversation"])
def test_messages_column_is_handed_over_under_trl_name(tmp_path: Path, field: str) -> None:
    tok = build_tokenizer(LLAMA_TEMPLATE, bos_on_encode=True)
    data = tmp_path / "chat.jsonl"
    rows_in = [{field: CONVERSATIONS[0], "prompt": "x"}, {field: [], "prompt": "y"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows_in))
    spec = DatasetSpec(name_or_path=str(data), format=DatasetFormat.messages, messages_field=field)
    _, splits = load_splits(spec, seed=0)
    rows = trl_rows(splits.train, spec, splits.format, tok)
    # Only the conversation: a `prompt` column would make TRL treat the row as prompt-completion.
    assert rows.column_names == ["messages"] and len(rows) == 1
