"""Training methods and data formats in the spec (ftq/contract/spec.py: TrainingSpec, METHOD_FORMATS,
auto_format)
and what a row of data is (ftq/contract/datasets.py: detect_formats, methods_for)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ftq.contract.datasets import detect_formats, methods_for
from ftq.contract.spec import (
    FORMAT_COLUMNS,
    METHOD_FORMATS,
    METHOD_TRAINERS,
    DpoSpec,
    JobSpec,
    KtoSpec,
    SpecFieldError,
    auto_format,
)

TEXT = {"text": "one two three."}
MESSAGES = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
PROMPT_COMPLETION = {"prompt": "count from one.", "completion": " one two three."}
PREFERENCE = {"prompt": "count from one.", "chosen": " one two.", "rejected": " two one."}
PREFERENCE_CHAT = {
    "chosen": [{"role": "user", "content": "count"}, {"role": "assistant", "content": "one two"}],
    "rejected": [{"role": "user", "content": "count"}, {"role": "assistant", "content": "two one"}],
}
UNPAIRED = {"prompt": "count from one.", "completion": " one two.", "label": True}
GRADER = {
    "type": "string_check",
    "input": "{{sample.output_text}}",
    "reference": "{{item.answer}}",
    "operation": "eq",
}


def spec(method: str = "sft", fmt: str = "auto", lora: bool = True, **training: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"name_or_path": "org/model"},
        "dataset": {"name_or_path": "org/data", "format": fmt},
        "training": {"max_steps": 1, "method": method, "per_device_train_batch_size": 2, **training},
    }
    if lora:
        body["lora"] = {}
    if method == "grpo":
        body["training"].setdefault("grpo", {"num_generations": 2})
        body["training"].setdefault("grader", GRADER)
    return body


def field_error(body: dict[str, Any]) -> SpecFieldError:
    """The cross-field error the spec raises (the service turns its loc into the 422's field)."""
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(body)
    (err,) = info.value.errors()
    cause = (err.get("ctx") or {}).get("error")
    assert isinstance(cause, SpecFieldError), err
    cause.loc = (*(str(part) for part in err["loc"]), *cause.loc)
    return cause


def test_method_defaults_to_sft_and_each_method_names_its_trainer() -> None:
    job = JobSpec.model_validate(spec(method="sft"))
    assert job.training.method == "sft" and job.training.loss_on == "all"
    assert job.training.method_parameters() is None
    assert set(METHOD_TRAINERS) == set(METHOD_FORMATS) == {"sft", "dpo", "kto", "reward", "grpo"}
    dpo = JobSpec.model_validate(spec(method="dpo")).training.method_parameters()
    assert isinstance(dpo, DpoSpec) and dpo.beta == 0.1 and dpo.loss_type == "sigmoid"
    kto = JobSpec.model_validate(
        spec(method="kto", kto={"desirable_weight": 1.5})
    ).training.method_parameters()
    assert isinstance(kto, KtoSpec) and kto.desirable_weight == 1.5


@pytest.mark.parametrize(
    ("method", "block"),
    [("sft", "dpo"), ("kto", "dpo"), ("dpo", "kto"), ("dpo", "reward"), ("reward", "kto")],
)
def test_a_methods_block_given_for_another_method_names_the_block(method: str, block: str) -> None:
    body = spec(method=method)
    body["training"][block] = {}
    err = field_error(body)
    assert err.loc == ("training", block)
    assert f"training.{block} is for method {block}" in err.message and method in err.message


def test_method_parameters_are_validated() -> None:
    with pytest.raises(ValidationError):
        JobSpec.model_validate(spec(method="dpo", dpo={"beta": 0}))
    with pytest.raises(ValidationError):
        JobSpec.model_validate(spec(method="dpo", dpo={"loss_type": "nope"}))
    with pytest.raises(ValidationError):
        JobSpec.model_validate(spec(method="dpo", dpo={"label_smoothing": 0.5}))
    with pytest.raises(ValidationError):
        JobSpec.model_validate(spec(method="kto", kto={"beta": 0.1, "unknown": 1}))
    err = field_error(spec(method="dpo", dpo={"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0]}))
    assert err.loc == ("training", "dpo", "loss_weights")
    ok = JobSpec.model_validate(
        spec(method="dpo", dpo={"loss_type": ["sigmoid", "sft"], "loss_weights": [1, 0.5]})
    )
    assert ok.training.dpo is not None and ok.training.dpo.loss_type == ["sigmoid", "sft"]
    err = field_error(spec(method="dpo", dpo={"sync_ref_model": True}))
    assert err.loc == ("training", "dpo", "sync_ref_model") and "LoRA" in err.message
    JobSpec.model_validate(spec(method="dpo", lora=False, dpo={"sync_ref_model": True}))


def test_kto_needs_two_rows_a_batch_for_its_kl_term() -> None:
    err = field_error(spec(method="kto", per_device_train_batch_size=1))
    assert err.loc == ("training", "per_device_train_batch_size")
    JobSpec.model_validate(
        spec(method="kto", per_device_train_batch_size=1, kto={"loss_type": "apo_zero_unpaired"})
    )


@pytest.mark.parametrize(
    ("method", "fmt", "ok"),
    [
        ("sft", "text", True),
        ("sft", "messages", True),
        ("sft", "prompt_completion", True),
        ("sft", "preference", False),
        ("dpo", "preference", True),
        ("dpo", "text", False),
        ("dpo", "unpaired_preference", False),
        ("kto", "unpaired_preference", True),
        ("kto", "preference", False),
        ("reward", "preference", True),
        ("reward", "messages", False),
        ("dpo", "openai_preference", True),
        ("reward", "openai_preference", True),
        ("sft", "openai_preference", False),
        # OpenAI's reinforcement rows and prompt-only rows: what GRPO trains on, and only GRPO.
        ("sft", "openai_reinforcement", False),
        ("dpo", "openai_reinforcement", False),
        ("sft", "prompt_only", False),
        ("grpo", "prompt_only", True),
        ("grpo", "openai_reinforcement", True),
        ("grpo", "messages", False),
    ],
)
def test_the_format_table_decides_which_data_a_method_takes(method: str, fmt: str, ok: bool) -> None:
    assert (fmt in METHOD_FORMATS[method]) is ok
    if ok:
        JobSpec.model_validate(spec(method=method, fmt=fmt))
        return
    err = field_error(spec(method=method, fmt=fmt))
    assert err.loc == ("dataset", "format")
    assert f"training.method {method} trains on" in err.message and fmt in err.message


def test_loss_on_needs_a_format_that_can_be_masked_and_is_for_sft_only() -> None:
    JobSpec.model_validate(spec(fmt="prompt_completion", loss_on="completion"))
    JobSpec.model_validate(spec(fmt="messages", loss_on="assistant"))
    JobSpec.model_validate(spec(fmt="auto", loss_on="assistant"))  # the columns decide, at submit or start
    for fmt, loss_on in (
        ("text", "completion"),
        ("messages", "completion"),
        ("prompt_completion", "assistant"),
    ):
        err = field_error(spec(fmt=fmt, loss_on=loss_on))
        assert err.loc == ("training", "loss_on") and fmt in err.message
    err = field_error(spec(method="dpo", loss_on="completion"))
    assert err.loc == ("training", "loss_on") and "method sft" in err.message
    err = field_error(spec(method="dpo", packing=True))
    assert err.loc == ("training", "packing")


def test_auto_format_reads_the_columns_the_method_needs() -> None:
    assert auto_format("sft", ["messages", "text"]) == "messages"
    assert auto_format("sft", ["text", "prompt", "completion"]) == "text"
    assert auto_format("sft", ["prompt", "completion"]) == "prompt_completion"
    assert auto_format("sft", ["body"]) == "text"  # the caller names the missing text column
    assert auto_format("sft", ["conv"], messages_field="conv") == "messages"
    assert auto_format("dpo", ["prompt", "chosen", "rejected"]) == "preference"
    assert auto_format("kto", ["text"]) == "unpaired_preference"
    assert FORMAT_COLUMNS["unpaired_preference"] == ("prompt", "completion", "label")
    assert auto_format("grpo", ["prompt", "answer"]) == "prompt_only"
    assert auto_format("grpo", ["messages", "answer"]) == "openai_reinforcement"


@pytest.mark.parametrize(
    ("row", "formats"),
    [
        (TEXT, {"text"}),
        (MESSAGES, {"messages"}),
        (PROMPT_COMPLETION, {"prompt_completion"}),
        (PREFERENCE, {"preference"}),
        (PREFERENCE_CHAT, {"preference"}),  # conversations carry their prompt as shared first turns
        (UNPAIRED, {"prompt_completion", "unpaired_preference"}),
        ({**TEXT, **PREFERENCE}, {"text", "preference"}),
        ({"text": ""}, set()),
        ({"messages": []}, set()),
        ({"messages": [{"content": "no role"}]}, set()),
        ({"chosen": "a", "rejected": "b"}, set()),  # text pairs need their prompt
        # label must be a bool
        ({"prompt": "p", "completion": "c", "label": "yes"}, {"prompt_completion"}),
        ({"prompt": "p", "completion": None}, {"prompt_only"}),  # a prompt for GRPO, nothing more
        ({"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4"}, {"prompt_only"}),
        ({"messages": [{"role": "user", "content": "2+2?"}]}, {"messages", "openai_reinforcement"}),
        ({"body": "x"}, set()),
    ],
)
def test_detect_formats(row: dict[str, Any], formats: set[str]) -> None:
    assert detect_formats(row) == formats


def test_methods_for_formats() -> None:
    assert methods_for({"text"}) == ["sft"]
    assert methods_for({"preference"}) == ["dpo", "reward"]
    assert methods_for(detect_formats(UNPAIRED)) == ["sft", "kto"]
    assert methods_for(detect_formats({"prompt": "2+2=", "answer": "4"})) == ["grpo"]
    assert methods_for({"openai_reinforcement"}) == ["grpo"]
    assert methods_for(set()) == []
