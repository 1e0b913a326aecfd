"""The trainer's dataset loading rules (trainer/data.py) on the tiny data: eval holdouts, splits named
after files, the chat format detected."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftq.contract.spec import DatasetSpec
from trainer.data import load_splits
from trainer.errors import DatasetError


def test_single_file_eval_split_is_a_deterministic_holdout(tiny_dir: Path) -> None:
    spec = DatasetSpec(name_or_path=str(tiny_dir / "data" / "train.jsonl"), eval_split="eval")
    _, a = load_splits(spec, seed=7)
    _, b = load_splits(spec, seed=7)
    assert a.eval is not None and b.eval is not None
    assert len(a.eval) == 100 and len(a.train) == 1900  # 5% of 2000 rows
    assert a.eval["text"] == b.eval["text"]
    _, other = load_splits(spec, seed=8)
    assert other.eval is not None and other.eval["text"] != a.eval["text"]  # the seed decides, nothing else


def test_folder_of_files_names_splits_after_files_and_detects_messages(tiny_dir: Path) -> None:
    _, text = load_splits(DatasetSpec(name_or_path=str(tiny_dir / "data"), eval_split="eval"), seed=0)
    assert text.format == "text" and text.eval is not None and len(text.eval) == 64
    _, chat = load_splits(DatasetSpec(name_or_path=str(tiny_dir / "chat"), eval_split="eval"), seed=0)
    assert chat.format == "messages" and chat.train.column_names == ["messages"]


def test_missing_eval_split_in_a_multi_split_dataset_lists_the_splits(tiny_dir: Path) -> None:
    with pytest.raises(DatasetError, match=r"has no split 'validation' \(splits: .*eval.*train"):
        load_splits(DatasetSpec(name_or_path=str(tiny_dir / "data"), eval_split="validation"), seed=0)
