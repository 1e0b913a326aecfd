"""The trainer's metrics writer (trainer/callbacks.py): one JSON line per logged step, nulls for what was
not logged, written by the main process only."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainer import callbacks
from trainer.callbacks import POINT_FIELDS, MetricsWriter, read_points


def _state(step: int, tokens: int, main: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        global_step=step,
        epoch=step / 10,
        max_steps=40,
        num_input_tokens_seen=tokens,
        is_world_process_zero=main,
    )


def test_metrics_writer_writes_points_with_nulls_for_what_was_not_logged(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    w = MetricsWriter(path)
    w.on_step_begin(None, _state(0, 0), None)
    w.on_log(
        None, _state(2, 1000), None, logs={"loss": 2.5, "learning_rate": 1e-4, "grad_norm": 0.7, "epoch": 0.2}
    )
    w.on_log(None, _state(2, 1000), None, logs={"eval_loss": 2.4, "eval_runtime": 1.0, "epoch": 0.2})
    w.on_log(
        None, _state(3, 1500), None, logs={"loss": float("nan"), "learning_rate": 1e-4, "grad_norm": math.inf}
    )
    w.on_log(
        None, _state(3, 1500), None, logs={"train_runtime": 9.0, "train_loss": 2.4}
    )  # summary: not a Point
    w.on_log(None, _state(4, 2000, main=False), None, logs={"loss": 2.0})  # another rank: writes nothing
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    train, evaluation, nan_point = (json.loads(line) for line in lines)
    assert set(POINT_FIELDS) | {"max_steps", "tokens_seen"} == set(train)
    assert (
        train["step"] == 2
        and train["loss"] == 2.5
        and train["eval_loss"] is None
        and train["max_steps"] == 40
    )
    assert train["tokens_per_second"] is not None and train["tokens_per_second"] > 0
    assert (
        evaluation["eval_loss"] == 2.4 and evaluation["loss"] is None and evaluation["learning_rate"] is None
    )
    assert nan_point["loss"] is None and nan_point["grad_norm"] is None  # JSON has no NaN
    assert read_points(path) == [train, evaluation, nan_point]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now


def test_tokens_per_second_is_the_same_across_save_and_eval_pauses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step takes 1 s and trains 100 tokens; logging every 2 steps, a 10 s checkpoint after step 3
    and a 5 s evaluation after step 7 (neither on a logging step). The rate stays 100 tokens/s: the
    steps before a pause leave the count when the pause leaves the clock."""
    clock = FakeClock()
    monkeypatch.setattr(callbacks.time, "time", clock.time)
    w = MetricsWriter(tmp_path / "metrics.jsonl")
    tokens = 0
    w.on_step_begin(None, _state(0, tokens), None)
    for step in range(1, 11):
        clock.now += 1.0
        tokens += 100
        if step % 2 == 0:
            w.on_log(None, _state(step, tokens), None, logs={"loss": 1.0})
        if step == 3:
            clock.now += 10.0
            w.on_save(None, _state(step, tokens), None)
        if step == 7:
            clock.now += 5.0
            w.on_log(None, _state(step, tokens), None, logs={"eval_loss": 1.0})
            w.on_evaluate(None, _state(step, tokens), None)
    train = [p for p in read_points(tmp_path / "metrics.jsonl") if p["loss"] is not None]
    assert [p["step"] for p in train] == [2, 4, 6, 8, 10]
    assert [p["tokens_per_second"] for p in train] == [100.0] * 5
    assert [p["tokens_seen"] for p in train] == [200, 400, 600, 800, 1000]


def test_the_main_process_logs_one_readable_line_per_point(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = MetricsWriter(tmp_path / "metrics.jsonl")
    caplog.set_level("INFO", logger="trainer")
    w.on_step_begin(None, _state(0, 0), None)
    w.on_log(None, _state(10, 5000), None, logs={"loss": 2.5, "learning_rate": 1e-4, "grad_norm": 0.7})
    w.on_log(None, _state(10, 5000, main=False), None, logs={"loss": 2.5})  # another rank: silent
    w.on_log(None, _state(10, 5000), None, logs={"train_runtime": 9.0, "train_loss": 2.4})  # summary: silent
    lines = [r.getMessage() for r in caplog.records if r.name == "trainer"]
    assert len(lines) == 1, lines
    assert re.fullmatch(
        r"step 10/40  loss 2\.5000  lr 1\.00e-04  grad norm 0\.700  [\d,]+ tokens/s  eta \d+:\d\d:\d\d",
        lines[0],
    ), lines[0]
