"""Graders scored exactly on known inputs: every type and operation, the templates, the formula."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from ftq.contract.formula import FormulaError, check, evaluate
from ftq.contract.graders import Grader, GraderRunRequest, clean_loc
from ftq.grading.errors import GraderError
from ftq.grading.sandbox import Limits
from ftq.grading.score import sample_dict, score
from ftq.grading.similarity import bleu, fuzzy_match, gleu, meteor, rouge_l, rouge_n

GRADER: TypeAdapter[Any] = TypeAdapter(Grader)


def _score(spec: dict[str, Any], text: str, item: dict[str, Any] | None = None) -> float:
    return score(GRADER.validate_python(spec), sample_dict(text), item or {}, Limits()).reward


@pytest.mark.parametrize(
    ("operation", "text", "reference", "reward"),
    [
        ("eq", "Paris", "Paris", 1.0),
        ("eq", "Paris", "paris", 0.0),
        ("ne", "Paris", "paris", 1.0),
        ("ne", "Paris", "Paris", 0.0),
        ("like", "It is Paris.", "Paris", 1.0),
        ("like", "It is paris.", "Paris", 0.0),
        ("ilike", "It is PARIS.", "paris", 1.0),
        ("ilike", "It is Rome.", "paris", 0.0),
    ],
)
def test_string_check(operation: str, text: str, reference: str, reward: float) -> None:
    spec = {
        "type": "string_check",
        "input": "{{sample.output_text}}",
        "reference": "{{item.answer}}",
        "operation": operation,
    }
    assert _score(spec, text, {"answer": reference}) == reward


def test_templates_reach_output_json_and_nested_items() -> None:
    spec = {
        "type": "string_check",
        "input": "{{ sample.output_json.city }}",
        "reference": "{{item.a.b}}",
        "operation": "eq",
    }
    sample = {"output_text": "", "output_json": {"city": "Oslo"}}
    g = GRADER.validate_python(spec)
    assert score(g, sample, {"a": {"b": "Oslo"}}, Limits()).reward == 1.0
    with pytest.raises(GraderError, match=r"item lacks"):
        score(g, sample, {"a": {}}, Limits())
    # Nothing in a template runs: a placeholder that is not a path stays as it was written.
    g = GRADER.validate_python(
        {"type": "string_check", "input": "{{ 7*7 }}", "reference": "{{ 7*7 }}", "operation": "eq"}
    )
    assert score(g, sample, {}, Limits()).reward == 1.0
    assert "49" not in str(g.input)


def test_similarity_metrics_exact_values() -> None:
    assert fuzzy_match("kitten", "sitting") == pytest.approx(2 * 4 / 13)
    assert fuzzy_match("abc", "abc") == 1.0
    # BLEU-4: 5 of 6 unigrams, 3/5 bigrams, 1/4 trigrams, 0 4-grams -> 0 (no smoothing).
    assert bleu("the cat sat on the mat", "the cat is on the mat") == 0.0
    hyp = "the quick brown fox jumps over the dog"
    ref = "the quick brown fox jumps over the lazy dog"
    # precisions 8/8, 6/7, 5/6, 4/5 (`the dog` matches no reference n-gram); brevity penalty exp(1 - 9/8).
    expected = math.exp(1 - 9 / 8) * math.exp(
        (math.log(1) + math.log(6 / 7) + math.log(5 / 6) + math.log(4 / 5)) / 4
    )
    assert bleu(hyp, ref) == pytest.approx(expected)
    assert bleu(ref, ref) == pytest.approx(1.0)
    # GLEU: 8+6+5+4=23 matched n-grams; 8+7+6+5=26 in the hypothesis, 9+8+7+6=30 in the reference.
    assert gleu(hyp, ref) == pytest.approx(23 / 30)
    # METEOR: 8 matches, P=1, R=8/9, 2 chunks.
    p, r = 1.0, 8 / 9
    fmean = p * r / (0.9 * p + 0.1 * r)
    assert meteor(hyp, ref) == pytest.approx(fmean * (1 - 0.5 * (2 / 8) ** 3))
    # ROUGE: lowercased alphanumeric tokens.
    assert rouge_n("The cat sat.", "the cat ran", 1) == pytest.approx(2 / 3)
    assert rouge_n("The cat sat.", "the cat ran", 2) == pytest.approx(1 / 2)
    assert rouge_n("a b c d e", "a b c d e", 5) == 1.0
    assert rouge_n("a b c d", "a b c d", 5) == 0.0
    assert rouge_l("a b c d", "a x c d") == pytest.approx(3 / 4)


@pytest.mark.parametrize(
    ("metric", "reward"),
    [
        ("fuzzy_match", 2 * 4 / 13),
        ("bleu", 0.0),
        ("gleu", 0.0),
        ("meteor", 0.0),
        ("rouge_1", 0.0),
        ("rouge_2", 0.0),
        ("rouge_3", 0.0),
        ("rouge_4", 0.0),
        ("rouge_5", 0.0),
        ("rouge_l", 0.0),
    ],
)
def test_text_similarity_grader_reads_the_metric(metric: str, reward: float) -> None:
    spec = {
        "type": "text_similarity",
        "input": "{{sample.output_text}}",
        "reference": "{{item.ref}}",
        "evaluation_metric": metric,
    }
    assert _score(spec, "kitten", {"ref": "sitting"}) == pytest.approx(reward)
    # Identical texts: 1.0, but METEOR's fragmentation penalty of one chunk of five words (as NLTK's).
    same = 1 - 0.5 * (1 / 5) ** 3 if metric == "meteor" else 1.0
    assert _score(spec, "the same five word text", {"ref": "the same five word text"}) == pytest.approx(same)


def test_python_grader_and_multi() -> None:
    source = "def grade(sample, item):\n    return len(sample['output_text']) / item['n']\n"
    assert _score({"type": "python", "source": source}, "abcd", {"n": 8}) == 0.5
    multi = {
        "type": "multi",
        "graders": {
            "exact": {
                "type": "string_check",
                "input": "{{sample.output_text}}",
                "reference": "{{item.a}}",
                "operation": "eq",
            },
            "length": {"type": "python", "source": source},
        },
        "calculate_output": "0.5 * exact + 0.5 * min(length, 1) - (length > 2) * 0.1",
    }
    g = GRADER.validate_python(multi)
    result = score(g, sample_dict("abcd"), {"a": "abcd", "n": 8}, Limits())
    assert result.sub_rewards == {"exact": 1.0, "length": 0.5}
    assert result.reward == pytest.approx(0.75)


def test_formula_evaluates_the_allowed_nodes() -> None:
    v = {"a": 0.25, "b": 4.0}
    assert evaluate("sqrt(b) + a ** 2 - -a", v) == pytest.approx(2 + 0.0625 + 0.25)
    assert evaluate("max(a, b, 1) / abs(-2) + log(exp(1))", v) == pytest.approx(3.0)
    assert evaluate("(a < b) + (a >= b)", v) == 1.0


@pytest.mark.parametrize(
    "formula",
    [
        "__import__('os').system('true')",
        "a.__class__",
        "a.real",
        "open('x')",
        "eval('1')",
        "(lambda: 1)()",
        "[a][0]",
        "'text'",
        "c + 1",
        "a if b else 1",
        "a and b",
        "10 ** 10 ** 10",
        "(0 - a) ** 0.5",
        "log(a - a)",
        "a / (b - b)",
    ],
)
def test_formula_refuses_what_is_not_allowed(formula: str) -> None:
    with pytest.raises(FormulaError):
        check(formula, {"a", "b"})
        evaluate(formula, {"a": 1.0, "b": 2.0})


def test_invalid_graders_name_the_field() -> None:
    body: dict[str, Any] = {
        "grader": {
            "type": "multi",
            "graders": {"b": {"type": "string_check", "input": "", "reference": "", "operation": "contains"}},
            "calculate_output": "b",
        },
        "model_sample": "x",
    }
    with pytest.raises(ValidationError) as e:
        GraderRunRequest.model_validate(body)
    assert [".".join(map(str, clean_loc(list(x["loc"])))) for x in e.value.errors()] == [
        "grader.graders.b.operation"
    ]
    body["grader"] = {
        "type": "multi",
        "graders": {"a": body["grader"]["graders"]["b"] | {"operation": "eq"}},
        "calculate_output": "a.__class__",
    }
    with pytest.raises(ValidationError, match="Attribute is not allowed"):
        GraderRunRequest.model_validate(body)
    with pytest.raises(ValidationError, match="defines no top-level"):
        GRADER.validate_python({"type": "python", "source": "def other(): pass"})


def test_score_model_parses_the_number_in_range() -> None:
    grader = GRADER.validate_python(
        {
            "type": "score_model",
            "model": "m",
            "input": [{"role": "user", "content": "{{item.q}} {{sample.output_text}}"}],
            "range": [0, 10],
        }
    )
    seen: list[list[dict[str, str]]] = []

    def answer(text: str) -> Any:
        def model(_: Any, messages: list[dict[str, str]]) -> str:
            seen.append(messages)
            return text

        return model

    assert score(grader, sample_dict("42"), {"q": "Rate:"}, Limits(), answer("Score: 7.5/10")).reward == 7.5
    assert seen[0] == [{"role": "user", "content": "Rate: 42"}]
    with pytest.raises(GraderError, match=r"answered 11, outside range \[0, 10\]"):
        score(grader, sample_dict("42"), {"q": ""}, Limits(), answer("11"))
    with pytest.raises(GraderError, match="answered no number"):
        score(grader, sample_dict("42"), {"q": ""}, Limits(), answer("great"))

    def broken(_: Any, __: Any) -> str:
        raise OSError("no such model")

    with pytest.raises(GraderError, match="model 'm' failed: OSError: no such model"):
        score(grader, sample_dict("42"), {"q": ""}, Limits(), broken)
    with pytest.raises(ValidationError, match="low < high"):
        GRADER.validate_python(
            {
                "type": "score_model",
                "model": "m",
                "input": [{"role": "user", "content": "x"}],
                "range": [1, 0],
            }
        )
