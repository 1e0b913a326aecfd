"""The token counts behind tokens/s, from real single-process runs (trainer/callbacks.py,
trainer/train.py `sft_config`): every token of the epoch is counted, each document's EOS included, under
padding-free packing with a tokenizer whose pad is its EOS (as Llama's); and saves and evaluations
between logging steps change no count. The rates themselves are checked against a controlled clock in
tests/unit/trainer/test_callbacks.py: step times on a shared CPU vary too much (measured: 0.14 s to
1.8 s for the same step) for two real runs' rates to show a factor of 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.integration.trainer.helpers import explain, points, run_trainers, write_spec

pytestmark = pytest.mark.slow

MAX_LEN = 128


@pytest.fixture(scope="module")
def runs(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One epoch over the same rows twice: logging every step with no pauses, and logging every 2
    steps with a save and an evaluation every 3 (never on a logging step but every second time)."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("tokens")
    model = root / "model"
    shutil.copytree(tiny_dir / "model", model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    del cfg["pad_token"]  # Llama ships none: the trainer pads with EOS
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))

    tok: Any = AutoTokenizer.from_pretrained(tiny_dir / "model")
    texts = [
        json.loads(line)["text"] for line in (tiny_dir / "data" / "train.jsonl").read_text().splitlines()
    ]
    # Short enough that packing never cuts a document: the epoch's tokens are known without TRL.
    rows = [t for t in texts if len(tok(t)["input_ids"]) < MAX_LEN][:120]
    data = root / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    (data / "eval.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[-8:]))
    expected = sum(len(tok(t)["input_ids"]) + 1 for t in rows)  # + each document's EOS

    def args(name: str, **training: Any) -> list[str]:
        spec = {
            "model": {"name_or_path": str(model)},
            "dataset": {
                "name_or_path": str(data),
                "eval_split": "eval" if "eval_steps" in training else None,
            },
            "training": {
                "num_train_epochs": 1,
                "max_seq_len": MAX_LEN,
                "per_device_train_batch_size": 2,
                "learning_rate": 1e-3,
                "packing": True,
                "mixed_precision": "no",
                "seed": 11,
                **training,
            },
            "resources": {"device": "cpu"},
        }
        return ["--spec", str(write_spec(root / f"{name}.json", spec)), "--output_dir", str(root / name)]

    # The two runs are independent: side by side.
    procs = run_trainers(
        args("plain", logging_steps=1), args("paused", logging_steps=2, save_steps=3, eval_steps=3)
    )
    for proc in procs:
        assert proc.returncode == 0, explain(proc)
    plain, paused = (
        [p for p in points(root / name) if p["loss"] is not None] for name in ("plain", "paused")
    )
    return {"expected": expected, "plain": plain, "paused": paused}


def test_every_token_of_the_epoch_is_counted_with_each_eos(runs: dict[str, Any]) -> None:
    plain = runs["plain"]
    assert len(plain) >= 12  # enough steps for the pauses in the other run to recur
    assert plain[-1]["tokens_seen"] == runs["expected"]


def test_saves_and_evals_between_logging_steps_change_no_count(runs: dict[str, Any]) -> None:
    by_step = {p["step"]: p for p in runs["plain"]}
    paused = runs["paused"]
    # Every second step, and the last one, which a run always logs (trainer/train.py last_step_logger).
    last = max(by_step)
    assert [p["step"] for p in paused] == [s for s in by_step if s % 2 == 0 or s == last]
    assert [p["tokens_seen"] for p in paused] == [by_step[p["step"]]["tokens_seen"] for p in paused]
