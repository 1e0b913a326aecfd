"""ftq.planning.dataset_preflight: the statistics and the batch arithmetic, on the tiny model's own
tokenizer."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from ftq.contract.spec import JobSpec
from ftq.planning.dataset_preflight import analyse, token_stats
from tests.harness import tiny_assets, tiny_spec


def test_token_stats_percentiles() -> None:
    s = token_stats(list(range(1, 101)))
    assert (s.min, s.median, s.p95, s.max) == (1, 50, 95, 100)
    assert token_stats([7]).p95 == 7


def _spec(**training: object) -> JobSpec:
    return JobSpec.model_validate(tiny_spec(tiny_assets(), **training))  # type: ignore[arg-type]


def test_text_rows_are_counted_with_the_models_tokenizer(tmp_path: Path) -> None:
    tiny = tiny_assets()
    texts = ["short", "a somewhat longer line of text " * 3, "mid length text here"]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = Tokenizer.from_file(str(tiny / "model" / "tokenizer.json"))
    lengths = [len(tok.encode(t).ids) for t in texts]
    spec = _spec(max_seq_len=max(8, sorted(lengths)[1]), per_device_train_batch_size=2, max_steps=10)
    d = analyse(spec, path, source=str(path), known_rows=None, sample_rows=100)
    assert d.rows == 3 and d.rows_exact and not d.sampled
    assert d.tokens_per_sample is not None and d.tokens_per_sample.max == max(lengths)
    assert d.total_tokens == sum(lengths)
    assert d.truncated_samples == sum(1 for n in lengths if n > spec.training.max_seq_len)
    assert d.steps_per_epoch == math.ceil(3 / 2)
    mean = d.train_tokens_per_epoch / 3  # type: ignore[operator]
    assert d.run_tokens == round(10 * 2 * mean)


def test_packing_counts_sequences_of_max_seq_len(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": "word " * 30}) + "\n" for _ in range(40)))
    spec = _spec(max_seq_len=16, packing=True, per_device_train_batch_size=4, max_steps=1)
    d = analyse(spec, path, source="x", known_rows=None, sample_rows=100)
    assert d.train_tokens_per_epoch == 40 * 16
    assert d.steps_per_epoch == math.ceil(40 * 16 / 16 / 4)
    assert d.run_tokens == 1 * 4 * 16  # one step of four full sequences


def test_no_readable_data_still_gives_the_batch(tmp_path: Path) -> None:
    spec = _spec(gradient_accumulation_steps=4)
    d = analyse(spec, None, source="org/data", known_rows=None, sample_rows=10)
    assert d.effective_batch_size == 2 * 4 and d.rows is None and d.skipped


def test_openai_preference_rows_count_the_prompt_and_the_longer_answer(tmp_path: Path) -> None:
    row = {
        "input": {"messages": [{"role": "user", "content": "count from one."}]},
        "preferred_output": [{"role": "assistant", "content": "one two three four five six."}],
        "non_preferred_output": [{"role": "assistant", "content": "one."}],
    }
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(row) + "\n")
    body = tiny_spec(tiny_assets(), max_steps=1, method="dpo")
    body["dataset"] = {"name_or_path": str(path)}
    spec = JobSpec.model_validate(body)
    d = analyse(spec, path, source="x", known_rows=None, sample_rows=100)
    assert d.rows == 1 and d.tokens_per_sample is not None, d
    short = {**row, "preferred_output": row["non_preferred_output"]}
    path.write_text(json.dumps(short) + "\n")
    shorter = analyse(spec, path, source="x", known_rows=None, sample_rows=100)
    assert shorter.tokens_per_sample is not None
    assert shorter.tokens_per_sample.max < d.tokens_per_sample.max


def test_a_file_analysed_again_is_not_tokenized_again_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ftq.planning import dataset_preflight

    counted: list[str] = []
    count = dataset_preflight._Tokenizer.count

    def counting(self: Any, text: str, *, special: bool = True) -> int:
        counted.append(text)
        return count(self, text, special=special)

    monkeypatch.setattr(dataset_preflight._Tokenizer, "count", counting)
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": f"row {i} " * (i + 1)}) + "\n" for i in range(20)))
    spec = _spec(max_seq_len=16, per_device_train_batch_size=2, max_steps=5)
    first = analyse(spec, path, source="x", known_rows=None, sample_rows=100)
    assert len(counted) == 20
    # A sweep on the same file (another learning rate, another batch): the counts are reused, the
    # arithmetic on them is the new spec's.
    again = analyse(spec, path, source="x", known_rows=None, sample_rows=100)
    wider = _spec(max_seq_len=16, per_device_train_batch_size=4, max_steps=5)
    other = analyse(wider, path, source="x", known_rows=None, sample_rows=100)
    assert len(counted) == 20
    assert again == first and other.tokens_per_sample == first.tokens_per_sample
    assert other.steps_per_epoch == math.ceil(20 / 4) != first.steps_per_epoch
    # The file changes: it is read and tokenized again.
    path.write_text("".join(json.dumps({"text": "one more row " * 3}) + "\n" for _ in range(5)))
    changed = analyse(spec, path, source="x", known_rows=None, sample_rows=100)
    assert len(counted) == 25 and changed.rows == 5 and changed != first
    # Another field of the same rows is another count.
    rows = "".join(json.dumps({"text": "a b c", "body": "d e f g h i j"}) + "\n" for _ in range(3))
    both = tmp_path / "both.jsonl"
    both.write_text(rows)
    analyse(spec, both, source="x", known_rows=None, sample_rows=100)
    body = JobSpec.model_validate(
        {
            **spec.model_dump(mode="json"),
            "dataset": {**spec.dataset.model_dump(mode="json"), "text_field": "body"},
        }
    )
    by_body = analyse(body, both, source="x", known_rows=None, sample_rows=100).tokens_per_sample
    by_text = analyse(spec, both, source="x", known_rows=None, sample_rows=100).tokens_per_sample
    assert len(counted) == 31 and by_body is not None and by_text is not None
    assert by_body.max > by_text.max
