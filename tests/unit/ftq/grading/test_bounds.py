"""What one grader may cost: a template rendered past MAX_RENDERED_CHARS, a request's python graders
sharing one wall-clock budget, and a score model's prompt and answer capped."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from ftq.contract.graders import MAX_RENDERED_CHARS, Grader, ScoreModelGrader
from ftq.grading import model, score
from ftq.grading.errors import GraderError
from ftq.grading.sandbox import Limits
from ftq.grading.templates import render

GRADER: TypeAdapter[Any] = TypeAdapter(Grader)
TINY_MODEL = str(Path("examples/tiny/model").resolve())


def test_a_template_may_not_multiply_a_long_field() -> None:
    item = {"long": "x" * 100_000}
    assert len(render("{{item.long}}{{item.long}}", {}, item, "g")) == 200_000
    with pytest.raises(GraderError, match=f"more than {MAX_RENDERED_CHARS:,} characters"):
        render("{{item.long}}" * 1_000, {}, item, "g")
    # A value rendered as JSON counts as well.
    with pytest.raises(GraderError, match="renders to more than"):
        render("{{item}}" * 3, {}, item, "g")


def test_a_multis_python_graders_share_the_requests_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []

    def run_python(grader: str, source: str, batch: Any, limits: Limits) -> list[float]:
        seen.append(limits.timeout_seconds)
        time.sleep(0.3)
        return [1.0]

    monkeypatch.setattr(score, "run_python", run_python)
    py = {"type": "python", "source": "def grade(s, i):\n    return 1.0\n"}
    multi = GRADER.validate_python(
        {"type": "multi", "graders": {f"p{i}": py for i in range(8)}, "calculate_output": "p0"}
    )
    limits = Limits(timeout_seconds=30)
    # Without a deadline (the trainer's batches), each has the full limit.
    assert score.score(multi, {"output_text": ""}, {}, limits).reward == 1.0
    assert seen == [30] * 8
    seen.clear()
    with pytest.raises(GraderError) as e:
        score.score(multi, {"output_text": ""}, {}, limits, deadline=time.monotonic() + 1.0)
    assert e.value.limit == "wall_clock" and "wall-clock limit (30 s), which a request" in str(e.value)
    assert 2 <= len(seen) <= 4 and all(t <= 1.0 for t in seen)
    assert seen == sorted(seen, reverse=True)


def _judge(content: str, **params: Any) -> ScoreModelGrader:
    return ScoreModelGrader(
        type="score_model",
        name="judge",
        model=TINY_MODEL,
        input=[{"role": "user", "content": "x"}],  # type: ignore[list-item]
        sampling_params=params or None,
    )


def test_a_score_models_prompt_and_answer_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    # 250,000 characters (the sample that held the one lock for minutes): refused before tokenizing or
    # loading anything.
    monkeypatch.setattr(model, "_load", lambda name: pytest.fail("loaded the model"))
    started = time.monotonic()
    with pytest.raises(GraderError, match=r"250,000 characters; a score model reads at most 4096 tokens"):
        model.generate(_judge(""), [{"role": "user", "content": "y" * 250_000}])
    assert time.monotonic() - started < 1
    assert model.max_new_tokens(_judge("", max_completions_tokens=10_000)) == model.MAX_NEW_TOKENS
    assert model.max_new_tokens(_judge("", max_tokens=5)) == 5
    assert model.max_new_tokens(_judge("", max_tokens=-3)) == 1
    with pytest.raises(GraderError, match="not a number"):
        model.max_new_tokens(_judge("", max_tokens="many"))


def test_the_prompt_cap_counts_the_models_tokens() -> None:
    """Under the character bound, the tokens decide: the tiny model's tokenizer reads ~7,000 words as
    more than 4,096 tokens."""
    judge = _judge("")
    words = " ".join(f"w{i}" for i in range(7_000))
    assert len(words) < model.MAX_PROMPT_CHARS
    with pytest.raises(GraderError, match=r"tokens; a score model reads at most 4096 tokens"):
        model.generate(judge, [{"role": "user", "content": words}])
    # A short prompt is generated, at most MAX_NEW_TOKENS long.
    assert isinstance(model.generate(judge, [{"role": "user", "content": "Score: 1"}]), str)
