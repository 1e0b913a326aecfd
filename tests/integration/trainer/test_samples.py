"""Samples during training (spec `eval.sample_prompts`) under real `accelerate launch` runs on two CPU
processes: one line per prompt at every evaluation and at the end, written once by the main process; with
FSDP (1 and 2) and ZeRO-3 every rank takes part in the generation and the run neither hangs nor differs
from the saved model's own greedy output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.harness import tiny_spec
from tests.integration.trainer.helpers import (
    SAMPLE_NEW_TOKENS,
    SAMPLE_PROMPTS,
    Run,
    explain,
    launch_spec,
    with_samples,
)

pytestmark = pytest.mark.slow


def samples(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def greedy_from_final(tiny_dir: Path, final: Path, prompt: str) -> str:
    """What base + the saved adapter generates for `prompt`, greedily, in this process."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(final)
    model: Any = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_dir / "model"), final)
    model.eval()
    ids = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **ids, max_new_tokens=SAMPLE_NEW_TOKENS, do_sample=False, pad_token_id=tok.eos_token_id
        )
    new = out[0, ids["input_ids"].shape[1] :].tolist()
    if tok.eos_token_id in new:
        new = new[: new.index(tok.eos_token_id)]
    return str(tok.decode(new, skip_special_tokens=True))


def launch(tmp_path: Path, spec: dict[str, Any]) -> tuple[Path, str]:
    proc = launch_spec(with_samples(spec), tmp_path)
    assert proc.returncode == 0, explain(proc)
    return tmp_path / "run", proc.stderr


def test_ddp_with_an_eval_split_samples_at_each_eval_and_at_the_end(tiny_dir: Path, tmp_path: Path) -> None:
    spec = tiny_spec(tiny_dir, max_steps=5, processes=2, eval_steps=2)
    spec["dataset"] = {"name_or_path": str(tiny_dir / "data"), "eval_split": "eval"}
    out, log = launch(tmp_path, spec)

    found = samples(out)
    # Evaluations at steps 2 and 4, and the end (step 5): each prompt once each time, in order.
    assert [(s["step"], s["index"], s["prompt"]) for s in found] == [
        (step, i, p) for step in (2, 4, 5) for i, p in enumerate(SAMPLE_PROMPTS)
    ]
    assert all(isinstance(s["completion"], str) and s["time"] > 0 for s in found)
    assert log.count("samples at step") == 3 and "(main process)" in log
    # The last samples are the trained model's: what base + final/ generates greedily.
    for s in found[-2:]:
        assert s["completion"] == greedy_from_final(tiny_dir, out / "final", s["prompt"])


@pytest.mark.parametrize("version", [2, 1], ids=["fsdp2", "fsdp1"])
def test_fsdp_ranks_generate_together_without_hanging(tiny_dir: Path, tmp_path: Path, version: int) -> None:
    # No eval split: samples every save_steps (2) and at the end (3).
    spec = tiny_spec(tiny_dir, max_steps=3, processes=2, save_steps=2)
    spec["distributed"] = {"strategy": "fsdp", "fsdp": {"version": version}}
    out, log = launch(tmp_path, spec)
    assert "engaged fsdp" in log  # sharded for real, not accelerate's DDP fallback on CPU

    found = samples(out)
    assert [(s["step"], s["index"]) for s in found] == [(2, 0), (2, 1), (3, 0), (3, 1)]
    assert log.count("samples at step") == 2 and "(all ranks)" in log
    # Generated through the sharded model, the same text as the gathered adapter gives in one process.
    for s in found[-2:]:
        assert s["completion"] == greedy_from_final(tiny_dir, out / "final", s["prompt"])


def test_zero3_ranks_generate_together_without_hanging(tiny_dir: Path, zero3_lora_run: Run) -> None:
    # The launch in conftest.py (activation checkpointing on, as the Falcon job has it), 3 steps.
    out, log = zero3_lora_run.out, zero3_lora_run.log

    found = samples(out)
    # No eval split and no checkpoints: eval_steps is the cadence, and the end.
    assert [(s["step"], s["index"]) for s in found] == [(2, 0), (2, 1), (3, 0), (3, 1)]
    assert "(all ranks)" in log
    for s in found[-2:]:
        assert s["completion"] == greedy_from_final(tiny_dir, out / "final", s["prompt"])
