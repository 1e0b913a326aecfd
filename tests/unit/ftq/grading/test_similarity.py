"""text_similarity's metrics on rapidfuzz's compiled LCS: the values the former pure-Python metrics gave
(checked equal on 4,000 random pairs x 10 metrics before they were removed; these are their outputs on
fixed pairs), and long texts scored in seconds, not the hours a Python O(n*m) loop took."""

from __future__ import annotations

import random
import string
import time

import pytest

from ftq.grading.similarity import similarity

METRICS = ["fuzzy_match", "bleu", "gleu", "meteor", *(f"rouge_{n}" for n in range(1, 6)), "rouge_l"]

# (hypothesis, reference) -> each metric's value, as the pure-Python implementation computed it.
EXPECTED: list[tuple[str, str, list[float]]] = [
    ("kitten", "sitting", [0.6153846153846154, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    (
        "The quick brown fox jumps over the lazy dog",
        "the quick brown dog jumps over the lazy fox",
        [
            0.8837209302325582,
            0.3814165616365676,
            0.5,
            0.9561042524005487,
            1.0,
            0.625,
            0.42857142857142855,
            0.16666666666666666,
            0.0,
            0.7777777777777778,
        ],
    ),
    (
        "a b a b a c",
        "b a b c a a",
        [0.7272727272727273, 0.0, 0.5, 0.5, 1.0, 0.4000000000000001, 0.25, 0.0, 0.0, 0.6666666666666666],
    ),
    (
        "Ünïcödé 漢字 😀 text",
        "unicode 漢字 😀 Text",
        [0.7058823529411765, 0.0, 0.3, 0.7361111111111112, 1 / 3, 0.0, 0.0, 0.0, 0.0, 1 / 3],
    ),
    ("", "something", [0.0] * 10),
    (
        "the cat the cat on the mat",
        "the mat on the cat",
        [8 / 11, 0, 4 / 11, 0.4807692307692308, 0.8333333333333333, 0.6, 0, 0, 0, 0.5],
    ),
]


@pytest.mark.parametrize(("hypothesis", "reference", "values"), EXPECTED)
def test_the_values_of_the_pure_python_metrics(hypothesis: str, reference: str, values: list[float]) -> None:
    got = [similarity(m, hypothesis, reference) for m in METRICS]
    assert got == pytest.approx(values, abs=1e-9, rel=0)


def test_empty_texts() -> None:
    assert similarity("fuzzy_match", "", "") == 1.0
    assert similarity("rouge_l", "", "") == 0.0
    assert similarity("meteor", "", "") == 0.0


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(string.ascii_lowercase + "   ", k=n))


def test_a_megabyte_is_scored_in_seconds() -> None:
    """A 1 MB answer against a 4,000-character reference: 0.1 s here on rapidfuzz; the pure-Python
    loop's 4e9 cells at its 6.5e6 a second took about 10 minutes (4,000 x 4,000 took 3.1 s)."""
    rng = random.Random(3)
    answer, reference = _text(rng, 1_000_000), _text(rng, 4_000)
    for metric in METRICS:
        started = time.monotonic()
        value = similarity(metric, answer, reference)
        assert 0.0 <= value <= 1.0
        assert time.monotonic() - started < 10, metric
    # Texts that share everything score 1 (a sanity check of the compiled LCS on long input).
    started = time.monotonic()
    assert similarity("fuzzy_match", reference * 250, reference * 250) == 1.0
    assert time.monotonic() - started < 30
