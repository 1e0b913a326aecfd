"""A graders suite's rows (issue 50): the row formats GRPO trains on (a text or conversation `prompt`, or
OpenAI's reinforcement `messages`), checked when the job is submitted. A suite of `messages` rows was
accepted, then every evaluation failed on "row 1 has no text field 'prompt'"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ftq.contract.datasets import suite_prompt
from tests.harness import EXAMPLES
from tests.harness.inprocess import MakeClient
from trainer.evaluate import _prompt_ids

GRADER = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.answer}}",
    "operation": "eq",
}
ASK = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "2+2="}]


@pytest.mark.parametrize(
    ("row", "field", "prompt"),
    [
        ({"prompt": "2+2=", "answer": "4"}, "prompt", "2+2="),
        ({"prompt": ASK, "answer": "4"}, "prompt", ASK),  # prompt_only with a conversation
        ({"messages": ASK, "answer": "4"}, "prompt", ASK),  # OpenAI's reinforcement rows
        ({"question": "2+2=", "messages": ASK}, "question", "2+2="),  # prompt_field first
    ],
)
def test_the_rows_grpo_takes_give_a_prompt(row: dict[str, Any], field: str, prompt: Any) -> None:
    assert suite_prompt(row, field) == (prompt, "")


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ({"text": "2+2=", "answer": "4"}, "has no prompt: a text or conversation field 'prompt'"),
        ({"prompt": "", "answer": "4"}, "has no prompt in 'prompt'"),
        ({"messages": [*ASK, {"role": "assistant", "content": "4"}]}, "ends with the assistant's turn"),
        ([1, 2], "is not a JSON object"),
    ],
)
def test_a_row_without_a_prompt_says_why(row: Any, why: str) -> None:
    prompt, said = suite_prompt(row)
    assert prompt is None and why in said


def test_a_conversation_prompt_is_rendered_by_the_chat_template_with_the_generation_prompt(
    tiny_dir: Path,
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir / "model")
    rendered = tok.apply_chat_template(ASK, add_generation_prompt=True, tokenize=False)
    assert tok.decode(_prompt_ids(tok, ASK)) == rendered
    # A text prompt stays one user turn, as before.
    assert tok.decode(_prompt_ids(tok, "2+2=")) == tok.apply_chat_template(
        [{"role": "user", "content": "2+2="}], add_generation_prompt=True, tokenize=False
    )


def _spec(tiny_job: dict[str, Any], dataset: Path) -> dict[str, Any]:
    suite = {"name": "qa", "type": "graders", "dataset": str(dataset), "grader": GRADER}
    return {**tiny_job, "eval": {"suites": [suite]}}


def test_submit_takes_messages_rows_and_refuses_rows_without_a_prompt(
    make_client: MakeClient, store_url: str, tiny_job: dict[str, Any], tmp_path: Path
) -> None:
    client = make_client(store_url, local_roots=f"{EXAMPLES}:{tmp_path}")
    messages = tmp_path / "messages.jsonl"
    messages.write_text("".join(json.dumps({"messages": ASK, "answer": str(i)}) + "\n" for i in range(3)))
    ok = client.post("/jobs?dry_run=true", json=_spec(tiny_job, messages))
    assert ok.status_code == 200 and not ok.json()["warnings"], ok.text

    # The third row ends with the assistant's answer: refused at submit, naming the suite's dataset and row.
    bad = tmp_path / "answered.jsonl"
    rows = [{"prompt": "1+1=", "answer": "2"}] * 2 + [
        {"messages": [*ASK, {"role": "assistant", "content": "4"}]}
    ]
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # (A dry run answers with the plan and the refusal among its warnings; the submit is the 422.)
    r = client.post("/jobs", json=_spec(tiny_job, bad))
    assert r.status_code == 422, r.text
    [detail] = r.json()["detail"]
    assert detail["loc"] == ["body", "eval", "suites", 0, "dataset"], detail
    assert "row 3 has a conversation in 'messages' that ends with the assistant's turn" in detail["msg"]
