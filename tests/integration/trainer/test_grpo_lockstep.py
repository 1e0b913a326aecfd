"""GRPO under FSDP2 on two CPU processes, with completions that end early and unevenly across the ranks:
every rank runs as many generation forwards as the other (each forward all-gathers the layers' shards,
so a rank that stopped on its own would pair its collectives with another forward's), and the run
matches its one-process twin: the same completions token for token, the same losses and metrics.

The model is the tiny one with its LM head's end-of-sequence row scaled by 2.5, so greedy completions
end after 1 to 16 tokens depending on the prompt; generation is greedy (top_k 1) so that the two runs can
be compared at all (sampled completions depend on how a batch is split over ranks). The generation
forwards are counted in the trainer processes by generation_hook/sitecustomize.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness import REPO
from tests.integration.trainer.helpers import (
    accelerate_command,
    explain,
    points,
    rendered_config,
    trainer_env,
    write_spec,
)

pytestmark = pytest.mark.slow

HOOK = Path(__file__).parent / "generation_hook"
EOS_SCALE = 2.5
STEPS = 3


@pytest.fixture(scope="module")
def early_eos_model(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("early-eos")
    model: Any = AutoModelForCausalLM.from_pretrained(tiny_dir / "model")
    with torch.no_grad():
        model.lm_head.weight[model.config.eos_token_id] *= EOS_SCALE
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_dir / "model").save_pretrained(folder)
    return folder


def spec(model: Path, tiny_dir: Path, processes: int) -> dict[str, Any]:
    return {
        "model": {"name_or_path": str(model), "attn_implementation": "sdpa"},
        "dataset": {"name_or_path": str(tiny_dir / "prompt_completion" / "train.jsonl")},
        "training": {
            "method": "grpo",
            "max_seq_len": 64,
            "max_steps": STEPS,
            "logging_steps": 1,
            "learning_rate": 2e-2,
            "mixed_precision": "no",
            "save_steps": None,
            # 8 completions a step either way: 4 a rank, or all 8 in the one process.
            "per_device_train_batch_size": 8 // processes,
            "grpo": {"num_generations": 4, "max_completion_length": 16, "top_k": 1},
            "grader": {
                "type": "python",
                "name": "brevity",
                "source": "def grade(sample, item):\n    return 1.0 - len(sample['output_text']) / 80\n",
            },
        },
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
        "distributed": {"strategy": "fsdp", "fsdp": {"version": 2}}
        if processes > 1
        else {"strategy": "none"},
        "resources": {"launcher": "local", "device": "cpu", "processes_per_node": processes},
    }


def run(job: dict[str, Any], work: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    work.mkdir(parents=True, exist_ok=True)
    args = ["--spec", str(write_spec(work / "spec.json", job)), "--output_dir", str(work / "run")]
    environ = trainer_env()
    environ.update(
        PYTHONPATH=f"{HOOK}:{environ['PYTHONPATH']}", FTQ_TEST_GENERATION_LOG=str(work / "gen"), **env
    )
    if job["resources"]["processes_per_node"] > 1:
        (work / "accelerate_config.yaml").write_text(rendered_config(job))
        cmd = [*accelerate_command(work / "accelerate_config.yaml"), "-m", "trainer", *args]
    else:
        cmd = [sys.executable, "-m", "trainer", *args]
    proc = subprocess.run(cmd, cwd=REPO, env=environ, capture_output=True, text=True, timeout=300)
    return proc, work


def generations(work: Path, rank: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (work / f"gen.rank{rank}").read_text().splitlines()]


def completions(generation: dict[str, Any]) -> list[list[int]]:
    """The new tokens of each row of one generate() call, up to and with the end of sequence (id 2)."""
    rows = [row[generation["prompt_width"] :] for row in generation["tokens"]]
    return [row[: row.index(2) + 1] if 2 in row else row for row in rows]


def test_fsdp_ranks_generate_in_lockstep_and_match_one_process(
    tiny_dir: Path, early_eos_model: Path, tmp_path: Path
) -> None:
    two, work2 = run(spec(early_eos_model, tiny_dir, 2), tmp_path / "fsdp2")
    assert two.returncode == 0, explain(two)
    assert "engaged fsdp" in two.stderr  # sharded for real, not accelerate's DDP fallback on CPU
    assert "GRPO generation: ranks generate in lockstep (weights sharded by fsdp)" in two.stderr
    one, work1 = run(spec(early_eos_model, tiny_dir, 1), tmp_path / "one")
    assert one.returncode == 0, explain(one)

    ranks = [generations(work2, 0), generations(work2, 1)]
    assert len(ranks[0]) == len(ranks[1]) == STEPS
    uneven = 0
    for step, (g0, g1) in enumerate(zip(*ranks, strict=True), start=1):
        assert g0["synced"] and g1["synced"]
        # The same number of forwards on both ranks, whichever rank's completions ended first.
        assert g0["forwards"] == g1["forwards"], (step, g0["forwards"], g1["forwards"])
        ends = [g["forwards"] if g["own_end"] is None else g["own_end"] for g in (g0, g1)]
        uneven += ends[0] != ends[1]
        print(f"step {step}: forwards {g0['forwards']} on both ranks; own completions ended after {ends}")
    assert uneven, "no step had one rank's completions end before the other's: the test shows nothing"

    # The twin generated the same 8 completions a step (rank 0's 4, then rank 1's) ...
    twin = generations(work1, 0)
    for step, (g0, g1, g) in enumerate(zip(*ranks, twin, strict=True), start=1):
        assert completions(g0) + completions(g1) == completions(g), step
    # ... and trained to the same losses and metrics.
    logged = {
        name: [p for p in points(w / "run") if p["loss"] is not None]
        for name, w in (("two", work2), ("one", work1))
    }
    assert (
        [p["step"] for p in logged["two"]] == [p["step"] for p in logged["one"]] == list(range(1, STEPS + 1))
    )
    for a, b in zip(logged["two"], logged["one"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        for name in ("reward", "completions/mean_length", "entropy"):
            assert a["extra"][name] == pytest.approx(b["extra"][name], rel=1e-4), (a["step"], name)
