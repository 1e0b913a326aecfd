"""Graders in OpenAI's grader JSON (`training.grader`, `POST /graders/run|validate`, and
`/v1/fine_tuning/alpha/graders/...`): what each type takes, validated here so that a bad grader is a 422
naming its field (`grader.graders.b.operation`). Scoring is in ftq.grading."""

from __future__ import annotations

import ast
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# What a template may name: `{{sample.output_text}}`, `{{sample.output_json.<key>}}`, `{{item.<field>}}`.
TEMPLATE_ROOTS = ("sample", "item")
# The limit on a grader's JSON pieces a user sends: sources, templates, formulas.
MAX_SOURCE_CHARS = 100_000
MAX_TEMPLATE_CHARS = 20_000
MAX_FORMULA_CHARS = 2_000
# A multi grader's tree: multi graders nest at most MAX_MULTI_DEPTH deep (a multi of multis of other
# graders), with at most MAX_SUB_GRADERS graders under the top one in all (a nested multi counts, and so
# does each of its graders), so one request holds a grading slot for a bounded number of graders.
MAX_MULTI_DEPTH = 2
MAX_SUB_GRADERS = 16
# What one `POST /graders/run` scores: the sample (its JSON, output_text and output_json together) and the
# item (its JSON), in characters; and a template once rendered (ftq.grading.templates), which a
# placeholder repeated over a long field would otherwise multiply. fuzzy_match of two texts this long
# takes about 1.6 s (rapidfuzz; docs/graders.md).
MAX_SAMPLE_CHARS = 262_144
MAX_ITEM_CHARS = 262_144
MAX_RENDERED_CHARS = 262_144

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
    graders: dict[str, Grader] = Field(..., min_length=1, max_length=MAX_SUB_GRADERS)
    calculate_output: str = Field(..., min_length=1, max_length=MAX_FORMULA_CHARS)

    @field_validator("graders")
    @classmethod
    def _names(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name in v:
            if not name.isidentifier():
                raise ValueError(f"grader name {name!r} is not an identifier (the formula names it)")
        # The sub-graders were validated first (each nested multi within its own bounds): this multi's.
        depth = 1 + max((multi_depth(g) for g in v.values()), default=0)
        if depth > MAX_MULTI_DEPTH:
            path, here = [], v
            while here:  # the deepest chain of multis, by name
                name = max(here, key=lambda n: multi_depth(here[n]))
                if multi_depth(here[name]) == 0:
                    break
                path.append(name)
                here = here[name].graders
            raise ValueError(
                f"multi graders nest {depth} deep here (through {'.'.join(path)}); at most "
                f"{MAX_MULTI_DEPTH} (a multi of multis)"
            )
        count = sum(1 + sub_grader_count(g) for g in v.values())
        if count > MAX_SUB_GRADERS:
            raise ValueError(
                f"{count} graders under this multi grader, nested ones counted; at most {MAX_SUB_GRADERS}"
            )
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


def multi_depth(grader: Any) -> int:
    """How deep multi graders nest in `grader`: 0 for any other type, 1 for a multi of other types."""
    if isinstance(grader, MultiGrader):
        return 1 + max((multi_depth(g) for g in grader.graders.values()), default=0)
    return 0


def sub_grader_count(grader: Any) -> int:
    """The graders under `grader`, at every level (0 for a grader that is not a multi)."""
    if isinstance(grader, MultiGrader):
        return sum(1 + sub_grader_count(g) for g in grader.graders.values())
    return 0


def needs_process(grader: Any) -> bool:
    """Whether scoring `grader` starts a python grader's process or runs a score model (the costly
    types); string_check and text_similarity graders are scored in the caller's thread."""
    if isinstance(grader, PythonGrader | ScoreModelGrader):
        return True
    if isinstance(grader, MultiGrader):
        return any(needs_process(g) for g in grader.graders.values())
    return False


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

    # A bound on what is parsed at all; the request's own check (MAX_SAMPLE_CHARS) names the field.
    output_text: str = Field("", max_length=1_000_000)
    output_json: dict[str, Any] | None = None


def _json_chars(value: Any) -> int:
    try:
        return len(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):
        raise ValueError("is not JSON this server can read back") from None


class GraderRunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grader: Grader
    model_sample: str | ModelSample = Field(
        ...,
        description=f"The sample: its text, or {{output_text, output_json}}; at most {MAX_SAMPLE_CHARS:,} "
        "characters (as JSON)",
    )
    item: dict[str, Any] = Field(
        default_factory=dict,
        description=f"The dataset row (`item.*` in templates); at most {MAX_ITEM_CHARS:,} characters as JSON",
    )

    @field_validator("model_sample")
    @classmethod
    def _sample_size(cls, v: str | ModelSample) -> str | ModelSample:
        size = len(v) if isinstance(v, str) else _json_chars(v.model_dump())
        if size > MAX_SAMPLE_CHARS:
            raise ValueError(f"the sample has {size:,} characters; at most {MAX_SAMPLE_CHARS:,}")
        return v

    @field_validator("item")
    @classmethod
    def _item_size(cls, v: dict[str, Any]) -> dict[str, Any]:
        size = _json_chars(v)
        if size > MAX_ITEM_CHARS:
            raise ValueError(f"the item has {size:,} characters as JSON; at most {MAX_ITEM_CHARS:,}")
        return v


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
