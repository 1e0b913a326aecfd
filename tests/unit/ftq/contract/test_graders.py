"""The grader contract's bounds: how deep multi graders nest, how many graders one holds, and the sizes of
sources, templates, samples and items, each refused naming its field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from ftq.contract.graders import (
    MAX_ITEM_CHARS,
    MAX_SAMPLE_CHARS,
    MAX_SOURCE_CHARS,
    MAX_SUB_GRADERS,
    MAX_TEMPLATE_CHARS,
    Grader,
    GraderRunRequest,
    clean_loc,
    multi_depth,
    needs_process,
    sub_grader_count,
)

GRADER: TypeAdapter[Any] = TypeAdapter(Grader)
EXACT = {"type": "string_check", "input": "{{sample.output_text}}", "reference": "x", "operation": "eq"}
PY = {"type": "python", "source": "def grade(s, i):\n    return 1.0\n"}


def multi(graders: dict[str, Any]) -> dict[str, Any]:
    return {"type": "multi", "graders": graders, "calculate_output": " + ".join(graders)}


def _refused(spec: dict[str, Any]) -> tuple[list[Any], str]:
    with pytest.raises(ValidationError) as e:
        GRADER.validate_python(spec)
    first = e.value.errors()[0]
    # As the routes name it (`grader.graders.b.operation`), without the leading `grader`.
    return clean_loc(["grader", *first["loc"]])[1:], str(first["msg"])


def test_multi_graders_nest_two_deep_at_most() -> None:
    two = GRADER.validate_python(multi({"a": multi({"b": EXACT}), "c": EXACT}))
    assert multi_depth(two) == 2 and sub_grader_count(two) == 3 and not needs_process(two)
    loc, msg = _refused(multi({"a": multi({"b": multi({"c": EXACT})})}))
    assert loc == ["graders"] and "nest 3 deep here (through a.b)" in msg


def test_a_multi_grader_holds_sixteen_graders_at_most() -> None:
    flat = GRADER.validate_python(multi({f"g{i}": EXACT for i in range(MAX_SUB_GRADERS)}))
    assert sub_grader_count(flat) == 16
    loc, msg = _refused(multi({f"g{i}": EXACT for i in range(MAX_SUB_GRADERS + 1)}))
    assert loc == ["graders"] and "at most 16" in msg
    # Nested ones count: 4 multis of 4 graders are 20.
    loc, msg = _refused(multi({f"m{i}": multi({f"g{j}": EXACT for j in range(4)}) for i in range(4)}))
    assert loc == ["graders"] and "20 graders under this multi grader" in msg
    # The 32 x 32 tree that passed before (about 8 h of one slot, in python graders).
    loc, _ = _refused(multi({f"m{i}": multi({f"g{j}": PY for j in range(32)}) for i in range(32)}))
    assert loc[0] == "graders"
    assert needs_process(GRADER.validate_python(multi({"a": multi({"p": PY})})))


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({**PY, "source": PY["source"] + "#" * MAX_SOURCE_CHARS}, "source"),
        ({**EXACT, "input": "x" * (MAX_TEMPLATE_CHARS + 1)}, "input"),
        ({**EXACT, "reference": "x" * (MAX_TEMPLATE_CHARS + 1)}, "reference"),
        (
            {
                "type": "text_similarity",
                "input": "x",
                "reference": "y" * (MAX_TEMPLATE_CHARS + 1),
                "evaluation_metric": "fuzzy_match",
            },
            "reference",
        ),
    ],
)
def test_sources_and_templates_are_bounded(spec: dict[str, Any], field: str) -> None:
    loc, msg = _refused(spec)
    assert loc == [field], msg
    loc, _ = _refused(multi({"inner": spec}))
    assert loc == ["graders", "inner", field]


def _request_refused(**body: Any) -> tuple[list[Any], str]:
    with pytest.raises(ValidationError) as e:
        GraderRunRequest.model_validate({"grader": EXACT, **body})
    first = e.value.errors()[0]
    return list(first["loc"]), str(first["msg"])


def test_the_sample_and_the_item_are_bounded() -> None:
    ok = GraderRunRequest.model_validate(
        {"grader": EXACT, "model_sample": "x" * MAX_SAMPLE_CHARS, "item": {"a": "y" * (MAX_ITEM_CHARS - 10)}}
    )
    assert len(str(ok.model_sample)) == MAX_SAMPLE_CHARS
    loc, msg = _request_refused(model_sample="x" * (MAX_SAMPLE_CHARS + 1))
    assert loc == ["model_sample"] and "at most 262,144" in msg
    # The sample's JSON answer counts, and its text with it.
    big_json = {"output_text": "x" * 200_000, "output_json": {"k": "y" * 100_000}}
    loc, msg = _request_refused(model_sample=big_json)
    assert loc == ["model_sample"] and "the sample has" in msg
    loc, msg = _request_refused(model_sample="x", item={"a": "y" * MAX_ITEM_CHARS})
    assert loc == ["item"] and "the item has" in msg
