"""One grader's reward for a sample and its item, as OpenAI documents them: string_check 1.0 or 0.0,
text_similarity the metric's value, python `grade()`'s value, multi its formula over the named graders'
rewards, score_model the number the model answers (ftq.grading.model). `score` may be given a deadline
for the whole grader (a multi's python graders share it), as `POST /graders/run` does."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ftq.contract.formula import FormulaError, evaluate
from ftq.contract.graders import (
    Grader,
    ModelSample,
    MultiGrader,
    PythonGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
)
from ftq.grading.errors import GraderError
from ftq.grading.sandbox import Limits, run_python
from ftq.grading.similarity import similarity
from ftq.grading.templates import render

# How a score_model grader is scored: (grader, rendered messages) -> the model's answer text.
ScoreModelFn = Callable[[ScoreModelGrader, list[dict[str, str]]], str]


@dataclass
class Result:
    reward: float
    sub_rewards: dict[str, float] = field(default_factory=dict)


def sample_dict(sample: str | ModelSample | dict[str, Any]) -> dict[str, Any]:
    if isinstance(sample, str):
        return {"output_text": sample, "output_json": None}
    if isinstance(sample, ModelSample):
        return sample.model_dump()
    return {"output_text": "", "output_json": None, **sample}


def _like(value: str, pattern: str, fold: bool) -> bool:
    # OpenAI's `like` is a substring test (SQL-like without wildcards): the reference within the input.
    return (pattern.lower() in value.lower()) if fold else (pattern in value)


def string_check(grader: StringCheckGrader, sample: dict[str, Any], item: dict[str, Any]) -> float:
    value = render(grader.input, sample, item, grader.name)
    reference = render(grader.reference, sample, item, grader.name)
    ok = {
        "eq": value == reference,
        "ne": value != reference,
        "like": _like(value, reference, False),
        "ilike": _like(value, reference, True),
    }[grader.operation]
    return 1.0 if ok else 0.0


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def parse_score(grader: ScoreModelGrader, text: str) -> float:
    """The first number in the model's answer, which must lie in the grader's range."""
    match = _NUMBER.search(text)
    if match is None:
        raise GraderError(grader.name, f"the model answered no number: {text[:200]!r}")
    value = float(match.group())
    low, high = grader.range
    if not low <= value <= high:
        raise GraderError(grader.name, f"the model answered {value:g}, outside range [{low:g}, {high:g}]")
    return value


def _left(grader: str, limits: Limits, deadline: float | None) -> Limits:
    """The limits, their wall clock cut to what is left before the deadline (a GraderError, limit
    wall_clock, when nothing is)."""
    if deadline is None:
        return limits
    left = deadline - time.monotonic()
    if left <= 0:
        raise GraderError(grader, "the request's wall-clock limit was spent", limit="wall_clock")
    return replace(limits, timeout_seconds=min(limits.timeout_seconds, left))


def score(
    grader: Grader,
    sample: dict[str, Any],
    item: dict[str, Any],
    limits: Limits,
    score_model: ScoreModelFn | None = None,
    deadline: float | None = None,
) -> Result:
    """The grader's reward (GraderError where it cannot be scored). `deadline` (time.monotonic()): where
    given, python graders get only the wall clock left before it, and none starts after it."""
    if isinstance(grader, StringCheckGrader):
        return Result(string_check(grader, sample, item))
    if isinstance(grader, TextSimilarityGrader):
        value = render(grader.input, sample, item, grader.name)
        reference = render(grader.reference, sample, item, grader.name)
        return Result(similarity(grader.evaluation_metric, value, reference))
    if isinstance(grader, PythonGrader):
        try:
            left = _left(grader.name, limits, deadline)
            return Result(run_python(grader.name, grader.source, [(sample, item)], left)[0])
        except GraderError as e:
            if deadline is None or e.limit != "wall_clock":
                raise
            # Its own limit was what was left of the request's: name the request's.
            raise GraderError(
                grader.name,
                f"exceeded the wall-clock limit ({limits.timeout_seconds:g} s), which a request's python "
                "graders share",
                limit="wall_clock",
                details=e.details,
            ) from None
    if isinstance(grader, ScoreModelGrader):
        if score_model is None:
            raise GraderError(grader.name, "score_model graders are not scored on this server")
        _left(grader.name, limits, deadline)
        messages = [
            {"role": m.role, "content": render(m.content, sample, item, grader.name)} for m in grader.input
        ]
        try:
            answer = score_model(grader, messages)
        except GraderError:
            raise
        except Exception as e:  # the model cannot be loaded or fails to generate: the grader's failure
            raise GraderError(
                grader.name, f"model {grader.model!r} failed: {type(e).__name__}: {e}"
            ) from None
        return Result(parse_score(grader, answer))
    assert isinstance(grader, MultiGrader)
    sub = {
        name: score(g, sample, item, limits, score_model, deadline).reward
        for name, g in grader.graders.items()
    }
    try:
        return Result(evaluate(grader.calculate_output, sub), sub)
    except FormulaError as e:
        raise GraderError(grader.name, f"calculate_output: {e}") from None


def score_batch(
    grader: Grader,
    samples: list[dict[str, Any]],
    items: list[dict[str, Any]],
    limits: Limits,
    score_model: ScoreModelFn | None = None,
) -> list[Result]:
    """Each (sample, item)'s reward, as `score` gives it, with each python grader run once for the whole
    batch (one sandboxed child process per python grader, not one per sample): how a GRPO step scores
    its completions. A multi grader scores each of its graders over the batch, then its formula per row."""
    if len(samples) != len(items):
        raise ValueError(f"{len(samples)} samples for {len(items)} items")
    if isinstance(grader, PythonGrader):
        rewards = run_python(grader.name, grader.source, list(zip(samples, items, strict=True)), limits)
        return [Result(r) for r in rewards]
    if isinstance(grader, MultiGrader):
        columns = {
            name: [r.reward for r in score_batch(g, samples, items, limits, score_model)]
            for name, g in grader.graders.items()
        }
        out = []
        for i in range(len(samples)):
            sub = {name: values[i] for name, values in columns.items()}
            try:
                out.append(Result(evaluate(grader.calculate_output, sub), sub))
            except FormulaError as e:
                raise GraderError(grader.name, f"calculate_output: {e}") from None
        return out
    return [score(grader, s, item, limits, score_model) for s, item in zip(samples, items, strict=True)]
