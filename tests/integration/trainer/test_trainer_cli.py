"""The entry point's contract without training: instant --help, parse-time refusals, ftq-error lines."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import REPO
from tests.integration.trainer.helpers import explain, run_trainer, write_spec


def _spec(tiny_dir: Path, **over: object) -> dict[str, object]:
    spec: dict[str, object] = {
        "model": {"name_or_path": str(tiny_dir / "model")},
        "dataset": {"name_or_path": str(tiny_dir / "data" / "train.jsonl"), "text_field": "text"},
        "training": {"max_seq_len": 64, "max_steps": 2, "mixed_precision": "no"},
        "resources": {"device": "cpu"},
    }
    spec.update(over)
    return spec


def _ftq_error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ftq-error: ")]


def test_help_is_instant_and_lists_the_train_py_flags() -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    for flag in (
        "--spec",
        "--output_dir",
        "--resume_from_checkpoint",
        "--model_name",
        "--dataset_text_field",
        "--use_peft_lora",
        "--lora_target_modules",
        "--use_flash_attn",
        "--warmup_ratio",
        "--seed",
    ):
        assert flag in proc.stdout
    # No torch/transformers import on this path: well under the ~10 s those take here.
    assert elapsed < 5, f"--help took {elapsed:.1f}s"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model_name", "./m"], "give --spec spec.json, or --model_name and --dataset_name"),
        (
            [
                "--model_name",
                "./m",
                "--dataset_name",
                "d.jsonl",
                "--max_steps",
                "5",
                "--num_train_epochs",
                "1",
            ],
            "set --max_steps or --num_train_epochs, not both",
        ),
        (
            ["--model_name", "./m", "--dataset_name", "d.jsonl", "--lora_r", "8"],
            "--lora_* flags need --use_peft_lora True",
        ),
        (
            ["--model_name", "./m", "--dataset_name", "d.jsonl", "--packing", "maybe"],
            "expected True or False",
        ),
        (
            ["--model_name", "./m", "--dataset_name", "d.jsonl", "--lr_scheduler_type", "zigzag"],
            "the flags do not make a valid job: training.lr_scheduler_type",
        ),
    ],
)
def test_invalid_flag_combinations_fail_at_parse_time(tmp_path: Path, argv: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", *argv, "--output_dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_spec_and_train_py_flags_are_exclusive(tiny_dir: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "spec.json", _spec(tiny_dir))
    proc = run_trainer(["--spec", str(spec), "--max_steps", "3", "--output_dir", str(tmp_path / "out")])
    assert proc.returncode == 2
    assert "--spec and the train.py flags (--max_steps) are exclusive" in proc.stderr


def test_invalid_spec_names_the_field(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path / "spec.json",
        {
            "model": {"name_or_path": "./m"},
            "dataset": {"name_or_path": "d.jsonl"},
            "training": {"max_steps": 0},
        },
    )
    proc = run_trainer(["--spec", str(spec), "--output_dir", str(tmp_path / "out")])
    assert proc.returncode == 2
    assert "is not a valid job spec: training.max_steps" in proc.stderr


def test_dataset_without_the_text_field_is_a_dataset_error(tiny_dir: Path, tmp_path: Path) -> None:
    spec = _spec(
        tiny_dir,
        dataset={"name_or_path": str(tiny_dir / "data" / "no_text_field.jsonl"), "text_field": "text"},
    )
    proc = run_trainer(
        ["--spec", str(write_spec(tmp_path / "spec.json", spec)), "--output_dir", str(tmp_path)]
    )
    assert proc.returncode == 2, explain(proc)
    lines = _ftq_error_lines(proc.stderr)
    assert len(lines) == 1, explain(proc)
    assert lines[0].startswith("ftq-error: dataset_error: ")
    assert "no text column 'text' (columns: body)" in lines[0]


def test_missing_dataset_is_a_dataset_error(tiny_dir: Path, tmp_path: Path) -> None:
    spec = _spec(tiny_dir, dataset={"name_or_path": str(tmp_path / "nope.jsonl")})
    proc = run_trainer(
        ["--spec", str(write_spec(tmp_path / "spec.json", spec)), "--output_dir", str(tmp_path)]
    )
    assert proc.returncode == 2, explain(proc)
    assert _ftq_error_lines(proc.stderr) == [
        f"ftq-error: dataset_error: dataset path {tmp_path / 'nope.jsonl'} does not exist"
    ]


def test_model_dir_without_weights_is_a_model_error_with_train_py_flags(
    tiny_dir: Path, tmp_path: Path
) -> None:
    proc = run_trainer(
        [
            "--model_name",
            str(tiny_dir / "model-no-weights"),
            "--dataset_name",
            str(tiny_dir / "data" / "train.jsonl"),
            "--dataset_text_field",
            "text",
            "--max_steps",
            "2",
            "--bf16",
            "False",
            "--output_dir",
            str(tmp_path),
        ]
    )
    assert proc.returncode == 2, explain(proc)
    lines = _ftq_error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("ftq-error: model_error: "), explain(proc)
    assert "has no weights" in lines[0]


@pytest.mark.slow
def test_unknown_lora_target_module_is_a_model_error(tiny_dir: Path, tmp_path: Path) -> None:
    spec = _spec(tiny_dir, lora={"target_modules": ["q_proj", "query_key_value"]})
    proc = run_trainer(
        ["--spec", str(write_spec(tmp_path / "spec.json", spec)), "--output_dir", str(tmp_path)]
    )
    assert proc.returncode == 2, explain(proc)
    lines = _ftq_error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("ftq-error: model_error: "), explain(proc)
    # The message lists what the model does have, so the user can pick.
    assert "query_key_value not found in LlamaForCausalLM" in lines[0] and "q_proj" in lines[0]
