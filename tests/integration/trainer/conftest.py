"""Launches that several modules read: one real `accelerate launch` serves every test that asserts
something about it, instead of a launch of its own per test (each costs half a minute of two CPUs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import tiny_spec
from tests.integration.trainer.helpers import Run, explain, launch_spec, with_samples


@pytest.fixture(scope="session")
def zero3_lora_run(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The Falcon job's setup on two CPU processes, as ftq renders it: LoRA on the attention projections
    under DeepSpeed ZeRO-3 with activation checkpointing, 3 steps, and sample prompts on the eval_steps
    cadence (no eval split, no checkpoints). test_checkpointing reads how it trained, test_samples what
    its ranks generated."""
    spec = tiny_spec(
        tiny_dir, max_steps=3, processes=2, save_steps=None, eval_steps=2, gradient_checkpointing=True
    )
    spec["lora"]["target_modules"] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    spec["distributed"] = {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}}
    work = tmp_path_factory.mktemp("zero3-lora")
    proc = launch_spec(with_samples(spec), work)
    assert proc.returncode == 0, explain(proc)
    assert "engaged deepspeed" in proc.stderr  # ZeRO-3 for real, not a fallback
    # Nor the inference-only shared-memory op DeepSpeed builds with g++ on a CPU (trainer/lean.py).
    assert "shm_comm" not in proc.stdout + proc.stderr, proc.stdout[-2000:]
    return Run(work / "run", proc.stderr)
