"""GRPO as a real `accelerate launch` of the trainer on the CPU (trainer/train.py, trainer/rewards.py):
on two DDP processes with LoRA, a python grader (run in the sandbox, a batch per child process) that
scores shorter completions higher makes the mean reward rise; its metrics reach metrics.jsonl under
TRL's names and its rollouts samples.jsonl. A grader that raises ends the run with `grader_error`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.trainer.helpers import explain, launch_spec, points, run_trainer, write_spec

pytestmark = pytest.mark.slow

SHORTER_IS_BETTER = "def grade(sample, item):\n    return 1.0 - len(sample['output_text']) / 80\n"


def grpo_spec(tiny_dir: Path, grader: dict[str, Any], *, processes: int, **training: Any) -> dict[str, Any]:
    return {
        "model": {"name_or_path": str(tiny_dir / "model"), "attn_implementation": "sdpa"},
        # prompt/completion rows: GRPO reads the prompt; `completion` reaches the grader as item.completion.
        "dataset": {"name_or_path": str(tiny_dir / "prompt_completion" / "train.jsonl")},
        "training": {
            "method": "grpo",
            "max_seq_len": 64,
            "logging_steps": 1,
            "learning_rate": 2e-2,
            "mixed_precision": "no",
            "save_steps": None,
            "per_device_train_batch_size": 4,
            "grpo": {"num_generations": 4, "max_completion_length": 16},
            "grader": grader,
            **training,
        },
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
        "distributed": {"strategy": "ddp" if processes > 1 else "none"},
        "resources": {"launcher": "local", "device": "cpu", "processes_per_node": processes},
    }


def test_grpo_on_two_processes_raises_the_reward_of_a_sandboxed_python_grader(
    tiny_dir: Path, tmp_path: Path
) -> None:
    grader = {
        "type": "multi",
        "name": "short",
        "graders": {
            "brevity": {"type": "python", "name": "brevity", "source": SHORTER_IS_BETTER},
            "answer": {
                "type": "string_check",
                "input": "{{sample.output_text}}",
                "reference": "{{item.completion}}",
                "operation": "ne",
            },
        },
        "calculate_output": "brevity * answer",
    }
    spec = grpo_spec(tiny_dir, grader, processes=2, max_steps=24)
    spec["training"]["grpo"]["beta"] = 0.04  # a KL term: with LoRA, against the adapter disabled
    proc = launch_spec(spec, tmp_path)
    assert proc.returncode == 0, explain(proc)
    log, out = proc.stderr, tmp_path / "run"
    assert "method grpo (trl.GRPOTrainer) on prompt_only data" in log
    assert "reward: grader 'short' (multi)" in log
    assert "reference model: the base model with the LoRA adapter disabled" in log

    pts = [p for p in points(out) if p["loss"] is not None]
    assert [p["step"] for p in pts] == list(range(1, 25))
    for p in pts:
        extra = p["extra"]
        for name in (
            "reward",
            "reward_std",
            "rewards/short/mean",
            "rewards/short/std",
            "completions/mean_length",
        ):
            assert isinstance(extra[name], float), (name, p)
        assert "rewards/short/brevity/mean" in extra and "clip_ratio/region_mean" in extra
        assert isinstance(extra["kl"], float)
        assert p["tokens_per_second"] and p["tokens_per_second"] > 0
    rewards = [p["extra"]["reward"] for p in pts]
    first, last = sum(rewards[:6]) / 6, sum(rewards[-6:]) / 6
    print(f"GRPO mean reward: first 6 steps {first:.3f}, last 6 steps {last:.3f}")
    assert last > first + 0.02, f"the mean reward went from {first:.3f} to {last:.3f}: {rewards}"

    rollouts = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rollouts} == set(range(1, 25))
    assert all(r["index"] >= 8 and isinstance(r["reward"], float) and r["prompt"] for r in rollouts)
    assert (out / "final" / "adapter_model.safetensors").is_file()


def test_a_grader_that_raises_ends_the_run_with_grader_error(tiny_dir: Path, tmp_path: Path) -> None:
    source = "def grade(sample, item):\n    return item['no_such_field']\n"
    spec = grpo_spec(
        tiny_dir, {"type": "python", "name": "broken", "source": source}, processes=1, max_steps=2
    )
    proc = run_trainer(
        ["--spec", str(write_spec(tmp_path / "spec.json", spec)), "--output_dir", str(tmp_path)]
    )
    assert proc.returncode == 2, explain(proc)
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("ftq-error:")]
    assert line.startswith("ftq-error: grader_error: grader 'broken': raised an exception")
    assert "KeyError: 'no_such_field'" in line  # the grader's own traceback, trimmed
    assert not (tmp_path / "final").exists()
