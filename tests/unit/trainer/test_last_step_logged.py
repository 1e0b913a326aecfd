"""A run logs its last step whatever `training.logging_steps` says (trainer/train.py `last_step_logger`).

transformers logs every `logging_steps` steps only: under the spec's default of 10 a run of 3 steps (a GRPO
try of `max_steps: 2`, issue 50) wrote no metrics point, so its follow ended at `step 0/3`. A real
SFTTrainer on the tiny model trains here, with and without the callback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ftq.contract.spec import JobSpec
from trainer.callbacks import metrics_callback, read_points
from trainer.train import last_step_logger, sft_config

STEPS = 3


def train(tiny_dir: Path, tmp_path: Path, callbacks: list[Any], **training: Any) -> list[dict[str, Any]]:
    """The metrics points of a STEPS-step SFT run on the tiny model with these callbacks (and the metrics
    writer, which writes a point at each logged step)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTTrainer

    spec = JobSpec.model_validate(
        {
            "model": {"name_or_path": str(tiny_dir / "model")},
            "dataset": {"name_or_path": str(tiny_dir / "data" / "train.jsonl")},
            # No logging_steps unless the test gives one: the spec's default (10) is the case of the issue.
            "training": {
                "max_steps": STEPS,
                "max_seq_len": 32,
                "per_device_train_batch_size": 2,
                "packing": False,
                "mixed_precision": "no",
                **training,
            },
            "resources": {"device": "cpu"},
        }
    )
    rows = [json.loads(line) for line in (tiny_dir / "data" / "train.jsonl").read_text().splitlines()[:8]]
    out = tmp_path / "run"
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_dir / "model"),
        args=sft_config(spec, out, has_eval=False),
        train_dataset=Dataset.from_list([{"text": r["text"]} for r in rows]),
        processing_class=AutoTokenizer.from_pretrained(tiny_dir / "model"),
        callbacks=[*callbacks, metrics_callback(out / "metrics.jsonl")],
    )
    trainer.train()
    return read_points(out / "metrics.jsonl")


def test_a_run_shorter_than_logging_steps_logs_its_last_step(tiny_dir: Path, tmp_path: Path) -> None:
    # Without the callback: the case of the issue, nothing logged (this is what the callback is for).
    assert [p["step"] for p in train(tiny_dir, tmp_path / "plain", [])] == []
    points = train(tiny_dir, tmp_path / "ftq", [last_step_logger()])
    assert [p["step"] for p in points] == [STEPS]
    assert points[0]["loss"] is not None and points[0]["loss"] > 0


def test_the_last_step_is_logged_once_beside_the_cadence(tiny_dir: Path, tmp_path: Path) -> None:
    # logging_steps 2 over 3 steps: step 2 by the cadence, step 3 as the last; a last step on the
    # cadence would not be logged twice (transformers skips a step it has logged).
    points = train(tiny_dir, tmp_path, [last_step_logger()], logging_steps=2)
    assert [p["step"] for p in points] == [2, 3]
