"""GRPO's reward function (trainer/rewards.py) and rows (trainer/data.py `grpo_rows`), in process: the
spec's grader scores each completion exactly as POST /graders/run does, a python grader's batch in one
sandboxed child, a multi grader's own graders logged, rollouts written; a failing grader is grader_error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from ftq.contract.errors import ErrorCode
from ftq.contract.graders import Grader
from ftq.contract.spec import DatasetSpec
from ftq.grading.sandbox import Limits
from trainer.data import ITEM_COLUMN, grpo_rows
from trainer.rewards import ROLLOUT_INDEX, GraderFailed, GraderReward, limits_from_env

GRADERS: TypeAdapter[Any] = TypeAdapter(Grader)


def grader(**body: Any) -> Any:
    return GRADERS.validate_python(body)


def call(reward: GraderReward, completions: list[Any], items: list[dict[str, Any]], **kw: Any) -> list[float]:
    prompts = ["2+2=?"] * len(completions)
    return reward(prompts, completions, **{ITEM_COLUMN: [json.dumps(i) for i in items]}, **kw)


def test_string_check_and_similarity_score_each_completion_against_its_item() -> None:
    eq = GraderReward(
        grader(
            type="string_check",
            name="exact",
            input="{{sample.output_text}}",
            reference="{{item.answer}}",
            operation="eq",
        ),
        Limits(),
    )
    assert eq.__name__ == "exact"  # TRL logs rewards/exact/mean
    items = [{"answer": "4"}, {"answer": "4"}, {"answer": "5"}]
    assert call(eq, ["4", " 4", "5"], items) == [1.0, 0.0, 1.0]
    # Conversational completions: the assistant turn's content is sample.output_text.
    assert call(eq, [[{"role": "assistant", "content": "4"}]], [{"answer": "4"}]) == [1.0]
    fuzzy = GraderReward(
        grader(
            type="text_similarity",
            input="{{sample.output_text}}",
            reference="{{item.completion}}",
            evaluation_metric="fuzzy_match",
        ),
        Limits(),
    )
    # A row's `completion` column (a reference) reaches the grader as item.completion.
    assert call(fuzzy, ["abcd", "abcd"], [{"completion": "abcd"}, {"completion": "wxyz"}]) == [1.0, 0.0]


def test_a_python_grader_scores_the_batch_and_a_multi_grader_logs_its_graders(tmp_path: Path) -> None:
    source = "def grade(sample, item):\n    return len(sample['output_text']) / item['n']\n"
    multi = grader(
        type="multi",
        name="mix",
        graders={
            "length": {"type": "python", "source": source},
            "yes": {
                "type": "string_check",
                "input": "{{sample.output_text}}",
                "reference": "yes",
                "operation": "ilike",
            },
        },
        calculate_output="0.5 * length + yes",
    )
    logged: dict[str, float] = {}
    reward = GraderReward(multi, Limits(), rollouts_path=tmp_path / "samples.jsonl", rollouts_per_log=2)

    class State:
        global_step = 0

    rewards = call(
        reward,
        ["YES", "no", "yes!"],
        [{"n": 3}, {"n": 4}, {"n": 8}],
        trainer_state=State(),
        log_metric=lambda name, value: logged.__setitem__(name, value),
    )
    assert rewards == [1.5, 0.25, 1.25]
    assert logged["rewards/mix/length/mean"] == pytest.approx((1 + 0.5 + 0.5) / 3)
    assert logged["rewards/mix/yes/mean"] == pytest.approx(2 / 3)
    assert logged["rewards/mix/yes/std"] == pytest.approx(0.57735, abs=1e-4)
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["index"], r["completion"], r["reward"]) for r in rows] == [
        (1, ROLLOUT_INDEX, "YES", 1.5),
        (1, ROLLOUT_INDEX + 1, "no", 0.25),
    ]
    call(reward, ["a"], [{"n": 1}], trainer_state=State())  # the same step again: recorded once
    assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("source", "limits", "says"),
    [
        ("def grade(sample, item):\n    return 1 / 0\n", Limits(), "ZeroDivisionError"),
        (
            "import time\ndef grade(sample, item):\n    time.sleep(30)\n",
            Limits(timeout_seconds=1),
            "wall-clock limit (1 s) (limit: wall_clock)",
        ),
    ],
)
def test_a_failing_grader_is_grader_error_naming_it(source: str, limits: Limits, says: str) -> None:
    reward = GraderReward(grader(type="python", name="judge", source=source), limits)
    with pytest.raises(GraderFailed) as info:
        call(reward, ["x"], [{}])
    assert info.value.code == ErrorCode.grader_error
    assert info.value.line().startswith("ftq-error: grader_error: grader 'judge':")
    assert says in info.value.message


def test_the_sandbox_limits_come_from_the_run_environment() -> None:
    limits = limits_from_env({"FTQ_GRADER_CPU_SECONDS": "3", "FTQ_GRADER_TIMEOUT_SECONDS": "2.5"})
    assert (limits.cpu_seconds, limits.timeout_seconds, limits.memory_mb) == (3, 2.5, Limits().memory_mb)


def test_grpo_rows_keep_the_prompt_and_hand_every_other_field_to_the_grader(tmp_path: Path) -> None:
    from datasets import Dataset

    spec = DatasetSpec(name_or_path="./x.jsonl")
    prompt_rows = Dataset.from_list(
        [{"prompt": "2+2=", "completion": "4", "level": 1}, {"prompt": "", "completion": "x", "level": 2}]
    )
    out = grpo_rows(prompt_rows, spec, "prompt_only", tokenizer=None)
    assert out.column_names == ["prompt", ITEM_COLUMN] and len(out) == 1  # the empty prompt is dropped
    assert json.loads(out[0][ITEM_COLUMN]) == {"completion": "4", "level": 1}

    class ChatTokenizer:
        chat_template = "{{ messages }}"

    rl = Dataset.from_list(
        [
            {"messages": [{"role": "user", "content": "2+2?"}], "answer": "4"},
            {
                "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                "answer": "-",
            },
        ]
    )
    out = grpo_rows(rl, spec, "openai_reinforcement", tokenizer=ChatTokenizer())
    assert len(out) == 1  # a conversation that ends with the assistant's turn has nothing to complete
    assert out[0]["prompt"] == [{"role": "user", "content": "2+2?"}]
    assert json.loads(out[0][ITEM_COLUMN]) == {"answer": "4"}
