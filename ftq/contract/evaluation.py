"""Evaluation suites (spec `eval.suites`, `eval.on`, `eval.select`) and the rules every process shares
about their results: the metric names, which checkpoint is best, and how a checkpoint is named in a
request (`final`, `best`, or a step).

An evaluation is a run of its own (`python -m trainer.evaluate`) on a saved checkpoint; it writes
`evaluations/<evaluation id>/results.json` into the job's run directory, `{"metrics": {name: value}, ...}`.
This module imports only pydantic and the contract, so the trainer, the worker and the service all read
it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, model_validator

from ftq.contract.graders import Grader

# evaluations/<evaluation id>/ in the run directory: its launch, request and results.
EVALUATIONS = "evaluations"
EVALUATION_REQUEST = "evaluation.json"
RESULTS = "results.json"

SUITE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}$"
SuiteName = Annotated[str, StringConstraints(pattern=SUITE_NAME_RE)]
TaskName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")]
FieldName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
LocalPath = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
FileId = Annotated[str, StringConstraints(pattern=r"^file_[0-9a-f]{24}$")]
MetricName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.,\-/]{0,255}$")]

MAX_SUITES = 8
MAX_EVAL_ROWS = 10_000
MAX_EVAL_NEW_TOKENS = 512


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_enum_values=True, validate_default=True)


class EvalOn(StrEnum):
    checkpoint = "checkpoint"
    final = "final"


class SelectMode(StrEnum):
    max = "max"
    min = "min"


class GradersSuite(_Strict):
    """Generate a completion for each prompt of a dataset and score it with a grader. Metrics:
    `<name>/score` (the mean reward) and, for a `multi` grader, `<name>/<sub-grader>` (their means)."""

    name: SuiteName
    type: Literal["graders"]
    dataset: LocalPath | None = Field(
        None,
        description="A local .jsonl file under the allowed roots: one JSON object a row, its fields the "
        "grader's `item.*`. Or `file_id`.",
    )
    file_id: FileId | None = Field(None, description="An uploaded file (POST /files) instead of `dataset`.")
    prompt_field: FieldName = Field("prompt", description="The row field that is the prompt.")
    grader: Grader = Field(description="How a completion is scored (OpenAI's grader JSON; see graders.md).")
    max_new_tokens: int = Field(32, ge=1, le=MAX_EVAL_NEW_TOKENS, description="Greedy tokens per prompt.")
    limit: int | None = Field(None, ge=1, le=MAX_EVAL_ROWS, description="Score only the first N rows.")

    @model_validator(mode="after")
    def _one_source(self) -> Any:
        if (self.dataset is None) == (self.file_id is None):
            raise ValueError("give the suite's dataset (a local path) or file_id (an upload), one of them")
        return self


class LmEvalSuite(_Strict):
    """lm-evaluation-harness tasks (the `eval` extra): by name, and custom task YAMLs from `task_dir`.
    Metrics: `<name>/<task>/<metric>` (e.g. `bench/tiny_mc/acc`)."""

    name: SuiteName
    type: Literal["lm_eval"]
    tasks: list[TaskName] = Field(min_length=1, max_length=32)
    task_dir: LocalPath | None = Field(
        None, description="A folder of task YAMLs under the allowed roots (lm_eval's --include_path)."
    )
    num_fewshot: int | None = Field(None, ge=0, le=64)
    limit: int | None = Field(None, ge=1, le=MAX_EVAL_ROWS, description="Documents per task.")
    batch_size: int = Field(8, ge=1, le=1024)


class LossSuite(_Strict):
    """Mean token loss on another dataset (a text field per row). Metric: `<name>/loss`."""

    name: SuiteName
    type: Literal["loss"]
    dataset: LocalPath | None = Field(None, description="A local .jsonl file under the allowed roots.")
    file_id: FileId | None = Field(None, description="An uploaded file (POST /files) instead of `dataset`.")
    text_field: FieldName = "text"
    max_seq_len: int = Field(512, ge=8, le=131_072)
    limit: int | None = Field(None, ge=1, le=MAX_EVAL_ROWS)

    @model_validator(mode="after")
    def _one_source(self) -> Any:
        if (self.dataset is None) == (self.file_id is None):
            raise ValueError("give the suite's dataset (a local path) or file_id (an upload), one of them")
        return self


Suite = Annotated[GradersSuite | LmEvalSuite | LossSuite, Field(discriminator="type")]


class Select(_Strict):
    metric: MetricName = Field(description="The metric that picks the best checkpoint, e.g. `qa/score`.")
    mode: SelectMode = Field(SelectMode.max, description="max: higher is better; min: lower is better.")


class SuiteError(ValueError):
    """A rule of `eval.suites`/`eval.select` broken; `loc`: the field it is about, under `eval`."""

    def __init__(self, loc: tuple[str | int, ...], message: str):
        super().__init__(message)
        self.loc = loc


def check_suites(suites: Sequence[Any], select: Select | None) -> None:
    """Suite names are unique and `select.metric` is one of theirs (SuiteError naming the field: the
    second suite of a name, `suites[i].name`, or `select`)."""
    first: dict[str, int] = {}
    for i, suite in enumerate(suites):
        if suite.name in first:
            raise SuiteError(
                ("suites", i, "name"),
                f"suites {first[suite.name]} and {i} are both named {suite.name!r}: each suite's name "
                "prefixes its metrics, so names are unique",
            )
        first[suite.name] = i
    if select is not None and select.metric.split("/", 1)[0] not in first:
        raise SuiteError(
            ("select",),
            f"select.metric {select.metric!r} names no suite of eval.suites ({', '.join(first) or 'none'}); "
            "metrics are <suite>/score, <suite>/<task>/<metric> or <suite>/loss",
        )


# Checkpoints as a request names them -------------------------------------------------------------------

FINAL = "final"
BEST = "best"


def _not_a_bool(value: Any) -> Any:
    # JSON's true is Python's True, which an int field would take for the step 1 (false: step 0).
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is not a checkpoint: give a step number or its name")
    return value


# A checkpoint as a request names it: a step, or one of the names beside it; never a boolean.
NotBool = BeforeValidator(_not_a_bool)
Step = Annotated[int, Field(ge=0)]
CheckpointRef = Annotated[Literal["final", "best"] | Step, NotBool]


def ref_label(step: int | None) -> str:
    """How a stored evaluation names its checkpoint: `final` or the step as text."""
    return FINAL if step is None else str(step)


# The best checkpoint ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scored:
    """One scored checkpoint: its step (None: final/) and its metrics."""

    step: int | None
    metrics: dict[str, float]


@dataclass(frozen=True)
class Best:
    step: int
    metric: str
    value: float


def best_of(scored: Iterable[Scored], metric: str, mode: str) -> Best | None:
    """The checkpoint whose `metric` is highest (mode max) or lowest (min); ties go to the earliest step,
    NaN never wins; final/ is not a checkpoint (it is the last one's weights). None when none has it."""
    best: Best | None = None
    for s in sorted((s for s in scored if s.step is not None), key=lambda s: s.step or 0):
        value = s.metrics.get(metric)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            continue
        better = best is None or (value > best.value if mode == SelectMode.max else value < best.value)
        if better:
            assert s.step is not None
            best = Best(step=s.step, metric=metric, value=float(value))
    return best
