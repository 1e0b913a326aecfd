"""text_similarity's metrics, each in [0, 1], in time linear in the texts or, for the two built on a
longest common subsequence, in rapidfuzz's compiled bit-parallel LCS (about n * m / 64 word operations,
with the GIL released): no metric here runs a quadratic loop in Python.

fuzzy_match: the normalized Indel similarity, 2 * LCS(chars) / (len(a) + len(b)) (rapidfuzz's
`fuzz.ratio` / 100). bleu: sentence BLEU-4, uniform weights, brevity penalty, no smoothing (NLTK's
`sentence_bleu` default). gleu: Google-BLEU, min(precision, recall) over 1- to 4-grams (NLTK's
`sentence_gleu`). meteor: METEOR with exact matches only (alpha 0.9, beta 3, gamma 0.5; NLTK's
`meteor_score` without its stemmer and WordNet stages). rouge_n / rouge_l: the F-measure of n-gram overlap
/ of the longest common subsequence over lowercased alphanumeric tokens (Google's `rouge_score`,
without stemming).
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter, defaultdict, deque
from collections.abc import Sequence

from rapidfuzz.distance import LCSseq


def _lcs_tokens(a: Sequence[str], b: Sequence[str]) -> int:
    """The LCS of two token lists, the tokens numbered first so that rapidfuzz compares exact ids (it
    would compare other objects by their hash)."""
    ids: dict[str, int] = {}
    a_ids = [ids.setdefault(t, len(ids)) for t in a]
    b_ids = [ids.setdefault(t, len(ids)) for t in b]
    return int(LCSseq.similarity(a_ids, b_ids))


def _ngrams(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def fuzzy_match(a: str, b: str) -> float:
    if not a and not b:
        return 1.0
    return 2 * int(LCSseq.similarity(a, b)) / (len(a) + len(b))


def bleu(hypothesis: str, reference: str) -> float:
    hyp, ref = hypothesis.split(), reference.split()
    if not hyp:
        return 0.0
    log_sum = 0.0
    for n in range(1, 5):
        h = _ngrams(hyp, n)
        total = sum(h.values())
        matched = sum((h & _ngrams(ref, n)).values())
        if total == 0 or matched == 0:
            return 0.0
        log_sum += math.log(matched / total) / 4
    penalty = 1.0 if len(hyp) > len(ref) else math.exp(1 - len(ref) / len(hyp))
    return penalty * math.exp(log_sum)


def gleu(hypothesis: str, reference: str) -> float:
    hyp, ref = hypothesis.split(), reference.split()
    matched = hyp_total = ref_total = 0
    for n in range(1, 5):
        h, r = _ngrams(hyp, n), _ngrams(ref, n)
        matched += sum((h & r).values())
        hyp_total += sum(h.values())
        ref_total += sum(r.values())
    if hyp_total == 0 or ref_total == 0:
        return 0.0
    return min(matched / hyp_total, matched / ref_total)


def meteor(
    hypothesis: str, reference: str, alpha: float = 0.9, beta: float = 3.0, gamma: float = 0.5
) -> float:
    hyp, ref = hypothesis.lower().split(), reference.lower().split()
    # Align each hypothesis word with the first unused equal reference word, left to right: each word's
    # reference positions in order, taken from the front.
    positions: defaultdict[str, deque[int]] = defaultdict(deque)
    for j, word in enumerate(ref):
        positions[word].append(j)
    pairs: list[tuple[int, int]] = []
    for i, word in enumerate(hyp):
        free = positions.get(word)
        if free:
            pairs.append((i, free.popleft()))
    matches = len(pairs)
    if matches == 0:
        return 0.0
    precision, recall = matches / len(hyp), matches / len(ref)
    fmean = precision * recall / (alpha * precision + (1 - alpha) * recall)
    chunks = 1 + sum(
        1 for (i0, j0), (i1, j1) in itertools.pairwise(pairs) if not (i1 == i0 + 1 and j1 == j0 + 1)
    )
    return float(fmean * (1 - gamma * (chunks / matches) ** beta))


def _rouge_tokens(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).split()


def _f1(overlap: int, hyp_total: int, ref_total: int) -> float:
    if overlap == 0 or hyp_total == 0 or ref_total == 0:
        return 0.0
    precision, recall = overlap / hyp_total, overlap / ref_total
    return 2 * precision * recall / (precision + recall)


def rouge_n(hypothesis: str, reference: str, n: int) -> float:
    h, r = _ngrams(_rouge_tokens(hypothesis), n), _ngrams(_rouge_tokens(reference), n)
    return _f1(sum((h & r).values()), sum(h.values()), sum(r.values()))


def rouge_l(hypothesis: str, reference: str) -> float:
    h, r = _rouge_tokens(hypothesis), _rouge_tokens(reference)
    return _f1(_lcs_tokens(h, r), len(h), len(r))


def similarity(metric: str, hypothesis: str, reference: str) -> float:
    if metric == "fuzzy_match":
        return fuzzy_match(hypothesis, reference)
    if metric == "bleu":
        return bleu(hypothesis, reference)
    if metric == "gleu":
        return gleu(hypothesis, reference)
    if metric == "meteor":
        return meteor(hypothesis, reference)
    if metric == "rouge_l":
        return rouge_l(hypothesis, reference)
    if metric.startswith("rouge_"):
        return rouge_n(hypothesis, reference, int(metric.removeprefix("rouge_")))
    raise ValueError(f"unknown metric {metric!r}")
