"""The trainer's metrics writer (trainer/callbacks.py): one JSON line per logged step, nulls for what was
not logged, written by the main process only."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

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
    assert set(POINT_FIELDS) | {"max_steps"} == set(train)
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
