"""Graders in OpenAI's grader JSON (`training.grader`, `POST /graders/run|validate`, and
`/v1/fine_tuning/alpha/graders/...`): what each type takes, validated here so that a bad grader is a 422
naming its field (`grader.graders.b.operation`). Scoring is in ftq.grading."""

from __future__ import annotations

import ast
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# What a template may name: `{{sample.output_text}}`, `{{sample.output_json.<key>}}`, `{{item.<field>}}`.
TEMPLATE_ROOTS = ("sample", "item")
# The limit on a grader's JSON pieces a user sends: sources, templates, formulas.
MAX_SOURCE_CHARS = 100_000
MAX_TEMPLATE_CHARS = 20_000
MAX_FORMULA_CHARS = 2_000

StringOperation = Literal["eq", "ne", "like", "ilike"]
# A number as the schema says: an int or a float, never a bool or a numeric string (strict).
Score = Annotated[float, Field(strict=True)]
SimilarityMetric = Literal[
    "fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l"
]


class _Grader(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field("grader", min_length=1, max_length=256, description="The grader's name")


class StringCheckGrader(_Grader):
    """1.0 where `operation` holds between the rendered `input` and `reference`, else 0.0."""

    type: Literal["string_check"]
    input: str = Field(
        ..., max_length=MAX_TEMPLATE_CHARS, description="A template, e.g. {{sample.output_text}}"
    )
    reference: str = Field(..., max_length=MAX_TEMPLATE_CHARS, description="A template, e.g. {{item.answer}}")
    operation: StringOperation


class TextSimilarityGrader(_Grader):
    """The metric's value between the rendered `input` and `reference`, in [0, 1]."""

    type: Literal["text_similarity"]
    input: str = Field(..., max_length=MAX_TEMPLATE_CHARS)
    reference: str = Field(..., max_length=MAX_TEMPLATE_CHARS)
    evaluation_metric: SimilarityMetric
    pass_threshold: Score | None = Field(None, description="OpenAI's field; the score is the metric's value")


class PythonGrader(_Grader):
    """`source` defines `grade(sample, item) -> float`; it runs sandboxed (see docs/graders.md)."""

    type: Literal["python"]
    source: str = Field(..., min_length=1, max_length=MAX_SOURCE_CHARS)
    image_tag: str | None = Field(None, max_length=256, description="OpenAI's field; ignored (one runtime)")
    pass_threshold: Score | None = None

    @field_validator("source")
    @classmethod
    def _defines_grade(cls, v: str) -> str:
        try:
            tree = ast.parse(v)
        except SyntaxError as e:
            raise ValueError(f"source is not valid Python: line {e.lineno}: {e.msg}") from None
        if not any(isinstance(n, ast.FunctionDef) and n.name == "grade" for n in tree.body):
            raise ValueError("source defines no top-level `def grade(sample, item)`")
        return v


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "developer"]
    content: str = Field(..., max_length=MAX_TEMPLATE_CHARS)
    type: Literal["message"] | None = None


class ScoreModelGrader(_Grader):
    """A local model the operator allows (FTQ_GRADER_SCORE_MODELS) reads the rendered messages and answers
    a number; the score is that number, refused (0.0 and an error) outside `range`."""

    type: Literal["score_model"]
    model: str = Field(..., min_length=1, max_length=512)
    input: list[InputMessage] = Field(..., min_length=1, max_length=32)
    range: tuple[Score, Score] = (0.0, 1.0)
    sampling_params: dict[str, Any] | None = None
    pass_threshold: Score | None = None

    @field_validator("range")
    @classmethod
    def _ordered(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not v[0] < v[1]:
            raise ValueError("range is [low, high] with low < high")
        return v


class MultiGrader(_Grader):
    """Named graders combined by `calculate_output`, a formula over their names (see ftq.grading.formula)."""

    type: Literal["multi"]
    graders: dict[str, Grader] = Field(..., min_length=1, max_length=32)
    calculate_output: str = Field(..., min_length=1, max_length=MAX_FORMULA_CHARS)

    @field_validator("graders")
    @classmethod
    def _names(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name in v:
            if not name.isidentifier():
                raise ValueError(f"grader name {name!r} is not an identifier (the formula names it)")
        return v

    @model_validator(mode="after")
    def _formula(self) -> MultiGrader:
        from ftq.contract.formula import FormulaError, check

        try:
            check(self.calculate_output, set(self.graders))
        except FormulaError as e:
            raise ValueError(f"calculate_output: {e}") from None
        return self


Grader = Annotated[
    StringCheckGrader | TextSimilarityGrader | PythonGrader | ScoreModelGrader | MultiGrader,
    Field(discriminator="type"),
]
MultiGrader.model_rebuild()


GRADER_TYPES = frozenset({"string_check", "text_similarity", "python", "score_model", "multi"})


def clean_loc(loc: list[Any]) -> list[Any]:
    """A validation error's location without the union's branch names pydantic puts in
    (`grader.multi.graders.b.string_check.operation` -> `grader.graders.b.operation`)."""
    out: list[Any] = []
    for part in loc:
        after_grader = out[-1:] == ["grader"] or (len(out) >= 2 and out[-2] == "graders")
        if part in GRADER_TYPES and after_grader:
            continue
        out.append(part)
    return out


def score_models(grader: Any, loc: tuple[Any, ...] = ("grader",)) -> list[tuple[tuple[Any, ...], str]]:
    """Each score_model grader's location and model, in a grader and its sub-graders."""
    if isinstance(grader, ScoreModelGrader):
        return [((*loc, "model"), grader.model)]
    if isinstance(grader, MultiGrader):
        return [
            hit for name, sub in grader.graders.items() for hit in score_models(sub, (*loc, "graders", name))
        ]
    return []


class ModelSample(BaseModel):
    """The model's answer a grader scores (`sample.*` in templates)."""

    model_config = ConfigDict(extra="allow")

    output_text: str = Field("", max_length=1_000_000)
    output_json: dict[str, Any] | None = None


class GraderRunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grader: Grader
    model_sample: str | ModelSample = Field(
        ..., description="The sample: its text, or {output_text, output_json}"
    )
    item: dict[str, Any] = Field(default_factory=dict, description="The dataset row (`item.*` in templates)")


class GraderValidateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grader: Grader


class GraderValidateResponse(BaseModel):
    grader: Grader


class GraderRunMetadata(BaseModel):
    errors: dict[str, Any] = Field(default_factory=dict)
    execution_time: float = 0.0
    name: str = ""
    type: str = ""
    sampled_model_name: str | None = None
    scores: dict[str, Any] = Field(default_factory=dict)
    token_usage: int | None = None
    sub_rewards: dict[str, float] = Field(default_factory=dict)


class GraderRunResponse(BaseModel):
    reward: float
    metadata: GraderRunMetadata
    sub_rewards: dict[str, float] = Field(default_factory=dict)
    model_grader_token_usage_per_model: dict[str, Any] = Field(default_factory=dict)
