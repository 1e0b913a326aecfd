"""Real training runs on CPU: one process, FSDP2 and DeepSpeed ZeRO-3 with two processes, resume."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.integration.trainer.helpers import (
    ACCELERATE_CLI,
    ACCELERATE_FSDP2_CPU,
    ACCELERATE_FSDP2_ONE_CPU,
    ACCELERATE_ZERO3_CPU,
    explain,
    launch_spec,
    launch_trainer,
    points,
    run_trainer,
    write_spec,
)

pytestmark = pytest.mark.slow

# Two computations of one loss in bf16 (other kernels, another order of sums) agree to about this.
TOL_BF16 = 2e-3


def lr_at(step: int, base: float, total: int, warmup_ratio: float, kind: str) -> float:
    """The LR transformers' scheduler gives at optimizer step `step` (1-based), written out independently."""
    warmup = math.ceil(total * warmup_ratio)
    s = step - 1  # the LR logged at step s is the one that step used: the schedule's value after s-1 steps
    if s < warmup:
        return base * s / max(1, warmup)
    progress = (s - warmup) / max(1, total - warmup)
    if kind == "cosine":
        return base * 0.5 * (1.0 + math.cos(math.pi * progress))
    return base * max(0.0, 1.0 - progress)  # linear


def train_points(run_dir: Path) -> list[dict[str, Any]]:
    return [p for p in points(run_dir) if p["loss"] is not None]


def load_and_generate(model_dir: Path, base: Path | None = None) -> tuple[Any, Any, str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(model_dir)
    model: Any
    if base is None:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
    else:
        from peft import PeftModel

        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), model_dir)
    model.eval()
    inputs = tok("one two three", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 5
    return model, tok, tok.decode(out[0])


def train_py_argv(tiny_dir: Path, out: Path) -> list[str]:
    """The acceptance job in train.py's flags: FSDP2, LoRA on attention, cosine with warmup, 40 steps in
    bf16, a sharded checkpoint at step 20."""
    return (
        f"--model_name {tiny_dir / 'model'} --dataset_name {tiny_dir / 'data' / 'train.jsonl'} "
        "--dataset_text_field text "
        f"--max_seq_len 128 --max_steps 40 --logging_steps 1 --save_steps 20 --bf16 True --packing True "
        f"--output_dir {out} --per_device_train_batch_size 4 --gradient_accumulation_steps 1 "
        "--use_gradient_checkpointing True --learning_rate 1e-3 --lr_scheduler_type cosine "
        "--weight_decay 0.0 "
        "--warmup_ratio 0.1 --use_flash_attn False --use_peft_lora True --lora_r 8 --lora_alpha 16 "
        "--lora_dropout 0.0 --lora_target_modules q_proj,k_proj,v_proj,o_proj --seed 42"
    ).split()


def test_train_py_command_line_under_fsdp2_on_two_cpu_processes_then_resume_on_one(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The acceptance check, in bf16 on two processes; then its sharded checkpoint resumed by one process
    (another world size: torch's distributed checkpoint reshards as it loads)."""
    out = tmp_path / "run"
    # The articles' own command line: their `accelerate launch`, not the module the worker runs.
    proc = launch_trainer(
        ACCELERATE_FSDP2_CPU, tmp_path, train_py_argv(tiny_dir, out), launcher=ACCELERATE_CLI
    )
    assert proc.returncode == 0, explain(proc)
    assert "engaged fsdp" in proc.stderr  # FSDP2 really ran, not accelerate's silent DDP fallback on CPU
    assert "FSDP computes in bfloat16" in proc.stderr  # its mixed-precision policy, from the plugin

    pts = train_points(out)
    assert [p["step"] for p in pts] == list(range(1, 41))
    assert all(p["max_steps"] == 40 and p["tokens_per_second"] and p["grad_norm"] is not None for p in pts)
    first, last = sum(p["loss"] for p in pts[:5]) / 5, sum(p["loss"] for p in pts[-5:]) / 5
    assert last <= first * 0.95, f"loss fell only from {first:.3f} to {last:.3f}"
    for p in pts:
        assert p["learning_rate"] == pytest.approx(
            lr_at(p["step"], 1e-3, 40, 0.1, "cosine"), rel=1e-6, abs=1e-12
        )

    # Intermediate checkpoints are sharded (each rank writes its own); final/ is the gathered adapter.
    assert (out / "checkpoints" / "checkpoint-20" / "pytorch_model_fsdp_0").is_dir()
    final = out / "final"
    adapter = json.loads((final / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    model, _, _ = load_and_generate(final, base=tiny_dir / "model")
    lora_b = [v for k, v in model.state_dict().items() if "lora_B" in k]
    assert len(lora_b) == 8 and all(float(t.abs().sum()) > 0 for t in lora_b)  # trained, not the zero init

    # Evaluations (trainer.evaluate) read the sharded checkpoints in one process: checkpoint-40 holds the
    # weights final/ holds, so it scores the same loss; checkpoint-20 is another model than the base.
    from trainer.evaluate import EvaluationArgs, evaluate

    spec = {
        "model": {"name_or_path": str(tiny_dir / "model")},
        "training": {"max_steps": 40},
        "dataset": {"name_or_path": str(tiny_dir / "data" / "train.jsonl")},
        "lora": {
            "r": 8,
            "alpha": 16,
            "dropout": 0.0,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        },
        "eval": {
            "suites": [{"name": "held", "type": "loss", "dataset": str(tiny_dir / "data" / "eval.jsonl")}]
        },
    }
    write_spec(out / "spec.json", spec)

    # The shards are read straight into the model (torch.distributed.checkpoint, no process group): no
    # merged copy in a temp folder, as accelerate's merge_fsdp_weights made.
    import tempfile

    from accelerate import utils

    def no_copy(*a: Any, **k: Any) -> Any:
        raise AssertionError("a sharded checkpoint is read into the model, not merged into a temp folder")

    with monkeypatch.context() as patched:
        patched.setattr(tempfile, "TemporaryDirectory", no_copy)
        patched.setattr(utils, "merge_fsdp_weights", no_copy)

        def held_loss(step: int | None) -> float:
            args = EvaluationArgs(f"e{step}", "j", out, out / "evaluations" / f"e{step}", step=step)
            result = evaluate(args)
            assert result["load"]["layout"] == ("adapter" if step is None else "fsdp")
            return float(result["metrics"]["held/loss"])

        at_40, at_final, at_20 = held_loss(40), held_loss(None), held_loss(20)
    assert at_40 == pytest.approx(at_final, rel=1e-5) and at_20 != pytest.approx(at_40, rel=1e-5)

    # One process goes on from checkpoint-20 to step 40, accumulating two micro-batches a step: the rows of
    # a step stay 8 (ftq refuses at submit a resume that changes them), so skipping the 20 steps trained
    # lands on the row where the two-process run was.
    (tmp_path / "one").mkdir()
    again = tmp_path / "one" / "run"
    ckpt = out / "checkpoints" / "checkpoint-20"
    argv = [*train_py_argv(tiny_dir, again), "--resume_from_checkpoint", str(ckpt)]
    argv += ["--gradient_accumulation_steps", "2"]
    proc = launch_trainer(ACCELERATE_FSDP2_ONE_CPU, tmp_path / "one", argv)
    assert proc.returncode == 0, explain(proc)
    assert "engaged fsdp" in proc.stderr and f"resuming from {ckpt}" in proc.stderr
    resumed = train_points(again)
    assert [p["step"] for p in resumed] == list(range(21, 41))
    for p in resumed:  # the schedule went on where it stopped
        assert p["learning_rate"] == pytest.approx(
            lr_at(p["step"], 1e-3, 40, 0.1, "cosine"), rel=1e-6, abs=1e-12
        )
    # It trained on from the checkpoint's adapter, on the rows the two-process run took at the same steps:
    # step by step its losses are that run's (bf16 and another reduction order: close, not equal).
    assert all(math.isfinite(p["loss"]) for p in resumed)
    for p, q in zip(resumed, pts[20:], strict=True):
        assert p["loss"] == pytest.approx(q["loss"], rel=0.03), (p["step"], p["loss"], q["loss"])
    again_mean = sum(p["loss"] for p in resumed) / 20
    assert again_mean < first * 0.95, (again_mean, first)


def test_zero3_full_finetune_in_bf16_saves_a_model_that_reloads_with_the_same_loss_and_resumes(
    tiny_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    spec = {
        "model": {"name_or_path": str(tiny_dir / "model")},
        "dataset": {"name_or_path": str(tiny_dir / "data"), "eval_split": "eval"},
        "training": {
            "max_seq_len": 128,
            "max_steps": 4,
            "per_device_train_batch_size": 2,
            "per_device_eval_batch_size": 1,
            "learning_rate": 1e-3,
            "logging_steps": 1,
            "save_steps": 2,
            "packing": False,
            "gradient_checkpointing": True,
            "mixed_precision": "bf16",  # DeepSpeed's bf16 path: bf16 weights, float32 master and state
            "seed": 3,
        },
        "distributed": {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}},
        "resources": {"device": "cpu", "processes_per_node": 2},
    }
    proc = launch_spec(spec, tmp_path, ACCELERATE_ZERO3_CPU)
    assert proc.returncode == 0, explain(proc)
    assert "engaged deepspeed" in proc.stderr and "dtype torch.bfloat16" in proc.stderr
    assert list((out / "checkpoints" / "checkpoint-2").glob("global_step2/zero_pp_rank_*_model_states.pt"))

    evals = [p for p in points(out) if p["eval_loss"] is not None]
    assert evals and evals[-1]["step"] == 4
    # The config did not ask for 16-bit gathering; final/ is a full model all the same.
    model, tok, _ = load_and_generate(out / "final")

    import torch

    rows = [json.loads(line)["text"] for line in (tiny_dir / "data" / "eval.jsonl").read_text().splitlines()]
    losses = []
    assert model.dtype == torch.bfloat16  # training.save_dtype: bf16 when training in bf16
    with torch.no_grad():
        for text in rows:  # as TRL prepared them: EOS appended, cut at max_seq_len, one row per batch
            ids = torch.tensor([(tok(text)["input_ids"] + [tok.eos_token_id])[:128]])
            losses.append(model(input_ids=ids, labels=ids).loss.item())
    assert sum(losses) / len(losses) == pytest.approx(evals[-1]["eval_loss"], abs=TOL_BF16)

    # The ZeRO-3 checkpoint at step 2, resumed on the same two processes: steps 3 and 4 again, from the
    # same partitions, optimizer state and data position, so with the same losses.
    (tmp_path / "again").mkdir()
    ckpt = out / "checkpoints" / "checkpoint-2"
    args = ["--spec", str(tmp_path / "spec.json"), "--output_dir", str(tmp_path / "again" / "run")]
    args += ["--resume_from_checkpoint", str(ckpt)]
    proc = launch_trainer(ACCELERATE_ZERO3_CPU, tmp_path / "again", args)
    assert proc.returncode == 0, explain(proc)
    assert f"resuming from {ckpt}" in proc.stderr
    resumed = train_points(tmp_path / "again" / "run")
    assert [p["step"] for p in resumed] == [3, 4]
    first_run = {p["step"]: p["loss"] for p in train_points(out)}
    assert [p["loss"] for p in resumed] == pytest.approx([first_run[3], first_run[4]], abs=TOL_BF16)


def weighted_chat(tiny_dir: Path, out: Path) -> Path:
    """The tiny chat data in OpenAI's chat format: every assistant turn weighted, the first answer of every
    other conversation with weight 0 (out of the loss)."""
    rows = [json.loads(line) for line in (tiny_dir / "chat" / "train.jsonl").read_text().splitlines()]
    for i, row in enumerate(rows):
        answers = [m for m in row["messages"] if m["role"] == "assistant"]
        for j, m in enumerate(answers):
            m["weight"] = 0 if (i % 2 == 0 and j == 0 and len(answers) > 1) else 1
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_single_process_lora_on_chat_data_then_resume_continues_at_the_checkpoint(
    tiny_dir: Path, tmp_path: Path
) -> None:
    # OpenAI's chat format, weights and all: ftq tokenizes it with the weight-0 turns masked.
    spec = {
        "model": {"name_or_path": str(tiny_dir / "model")},
        "dataset": {
            "name_or_path": str(weighted_chat(tiny_dir, tmp_path / "weighted.jsonl")),
            "format": "messages",
            "eval_split": "eval",
        },
        "training": {
            "max_seq_len": 128,
            "max_steps": 10,
            "per_device_train_batch_size": 4,
            "learning_rate": 5e-3,
            "lr_scheduler_type": "linear",
            "warmup_ratio": 0.2,
            "logging_steps": 1,
            "eval_steps": 5,
            "save_steps": 5,
            "packing": True,
            "mixed_precision": "no",
            "seed": 5,
        },
        "lora": {"r": 8, "alpha": 16, "dropout": 0.1, "target_modules": "all-linear"},
        "resources": {"device": "cpu"},
    }
    spec_path = write_spec(tmp_path / "spec.json", spec)
    first = tmp_path / "first"
    proc = run_trainer(["--spec", str(spec_path), "--output_dir", str(first)])
    assert proc.returncode == 0, explain(proc)
    assert re.search(r"OpenAI chat rows: [1-9]\d* assistant turn\(s\) with weight 0 left out", proc.stderr), (
        explain(proc)
    )
    pts = train_points(first)
    assert [p["step"] for p in pts] == list(range(1, 11))
    assert pts[-1]["loss"] < pts[0]["loss"] * 0.95, [p["loss"] for p in pts]
    for p in pts:
        assert p["learning_rate"] == pytest.approx(
            lr_at(p["step"], 5e-3, 10, 0.2, "linear"), rel=1e-6, abs=1e-12
        )
    assert [p["step"] for p in points(first) if p["eval_loss"] is not None] == [5, 10]  # held-out rows
    assert (first / "final" / "adapter_model.safetensors").is_file()
    assert (first / "final" / "chat_template.jinja").is_file()

    # Resume a copy of the run from its step-5 checkpoint: same steps 6..10 (optimizer, scheduler and RNG
    # state restored; LoRA dropout makes the RNG matter), and metrics.jsonl continues where it was.
    second = tmp_path / "second"
    (second / "checkpoints").mkdir(parents=True)
    shutil.copytree(first / "checkpoints" / "checkpoint-5", second / "checkpoints" / "checkpoint-5")
    proc = run_trainer(
        ["--spec", str(spec_path), "--output_dir", str(second), "--resume_from_checkpoint", "latest"]
    )
    assert proc.returncode == 0, explain(proc)
    resumed = train_points(second)
    assert [p["step"] for p in resumed] == list(range(6, 11))
    for a, b in zip(pts[5:], resumed, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["learning_rate"] == pytest.approx(a["learning_rate"], rel=1e-9)
