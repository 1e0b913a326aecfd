"""GRPO throughput on CPU: a GRPO job through ftq's trainer against a plain TRL GRPOTrainer script with
the same settings, as a ratio (issue 29's target: at least 0.95x).

    python -m bench.grpo_bench [--steps 12] [--rounds 3] [--out bench/out/grpo]

Both run on the `small` tiny model (trainer.tiny: 4 layers, hidden 256, built once under OUT), one
process each, one after the other, each round in the other order: LoRA (r 8, all-linear), 4 prompts a
step x 4 completions of 32 tokens, learning rate 1e-3, the same reward `1 - len(completion) / 80`.
ftq scores it as a `python` grader in the sandbox (a child process per batch, as every GRPO job does);
the baseline calls the same function in process, so the ratio includes the sandbox (about 20 ms a
batch here, bench/graders_bench.py; on examples/tiny, whose steps take 70 ms on a quiet machine, that
alone is 0.8x). Throughput is TRL's own count of prompt and completion tokens
(`state.num_input_tokens_seen`: generation and training; the same seeds make both runs generate the
same tokens) over the wall time from the end of step 2 (warm-up) to the last step, one figure per run;
the median of the rounds for each. On a shared machine single steps vary several-fold, so whole runs
are compared, in alternating order.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import OUT, log, note, result

REPO = Path(__file__).resolve().parent.parent
BATCH, GENERATIONS, COMPLETION, LR = 16, 4, 32, 1e-3
SOURCE = "def grade(sample, item):\n    return 1.0 - len(sample['output_text']) / 80\n"


def spec(tiny: Path, steps: int) -> dict[str, Any]:
    return {
        "model": {"name_or_path": str(tiny / "model"), "attn_implementation": "sdpa"},
        "dataset": {"name_or_path": str(tiny / "prompt_completion" / "train.jsonl")},
        "training": {
            "method": "grpo",
            "max_steps": steps,
            "max_seq_len": 64,
            "per_device_train_batch_size": BATCH,
            "learning_rate": LR,
            "lr_scheduler_type": "constant",
            "logging_steps": 1,
            "save_steps": None,
            "mixed_precision": "no",
            "seed": 0,
            "grpo": {"num_generations": GENERATIONS, "max_completion_length": COMPLETION},
            "grader": {"type": "python", "name": "short", "source": SOURCE},
        },
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
        "resources": {"device": "cpu"},
    }


def baseline(tiny: Path, steps: int, out: Path) -> None:
    """The plain TRL script a user would write by hand with the same settings."""
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    marks: list[dict[str, float]] = []

    class Clock(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                marks.append(
                    {
                        "time": time.time(),
                        "tokens": state.num_input_tokens_seen,
                        "step_time": logs.get("step_time"),
                    }
                )

    def short(completions: list[str], **kwargs: Any) -> list[float | None]:
        return [1.0 - len(c) / 80 for c in completions]

    tok = AutoTokenizer.from_pretrained(tiny / "model")
    model = AutoModelForCausalLM.from_pretrained(tiny / "model", attn_implementation="sdpa")
    ds = load_dataset("json", data_files=str(tiny / "prompt_completion" / "train.jsonl"), split="train")
    config = GRPOConfig(
        output_dir=str(out / "baseline-ckpt"),
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=LR,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        num_generations=GENERATIONS,
        max_completion_length=COMPLETION,
        use_cpu=True,
        bf16=False,  # the spec says mixed_precision "no"
        report_to="none",
        seed=0,
        disable_tqdm=True,
    )
    lora = LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=short,
        args=config,
        train_dataset=ds.remove_columns(["completion"]),
        processing_class=tok,
        peft_config=lora,
        callbacks=[Clock()],
    )
    trainer.train()
    (out / "baseline.json").write_text(json.dumps(marks))


def _rate(marks: list[tuple[float, float]]) -> float:
    """Tokens per second from the end of step 2 to the last step ((time, tokens) at each step's end)."""
    first = marks[1] if len(marks) > 3 else marks[0]
    last = marks[-1]
    return (last[1] - first[1]) / (last[0] - first[0])


def run_one(name: str, tiny: Path, steps: int, out: Path) -> float:
    """One run's tokens/s (TRL's token count over the wall time of the steps after warm-up)."""
    if name == "baseline":
        cmd = [
            sys.executable,
            "-m",
            "bench.grpo_bench",
            "--baseline",
            "--steps",
            str(steps),
            "--out",
            str(out),
            "--tiny",
            str(tiny),
        ]
        _run(cmd)
        return _rate([(m["time"], m["tokens"]) for m in json.loads((out / "baseline.json").read_text())])
    run_dir = out / "ftq"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(spec(tiny, steps)))
    _run(
        [
            sys.executable,
            "-m",
            "trainer",
            "--spec",
            str(run_dir / "spec.json"),
            "--output_dir",
            str(run_dir / "out"),
        ]
    )
    points = [json.loads(line) for line in (run_dir / "out" / "metrics.jsonl").read_text().splitlines()]
    return _rate([(p["time"], p["tokens_seen"]) for p in points if p.get("loss") is not None])


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-4000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT / "grpo")
    parser.add_argument("--baseline", action="store_true", help="internal: run the plain TRL script")
    parser.add_argument(
        "--tiny", type=Path, help="the model and data (default: the small tiny model under OUT)"
    )
    ns = parser.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    tiny = ns.tiny or ns.out / "tiny-small"
    if ns.baseline:
        baseline(tiny, ns.steps, ns.out)
        return
    if not (tiny / "model" / "model.safetensors").exists():
        _run([sys.executable, "-m", "trainer.tiny", "--out", str(tiny), "--size", "small"])
    runs = ["baseline", "ftq"]
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(ns.rounds):
        for name in runs[r % 2 :] + runs[: r % 2]:
            rates[name].append(run_one(name, tiny, ns.steps, ns.out))
            log(f"round {r + 1} {name}: {rates[name][-1]:.0f} tokens/s")
    base, ftq = statistics.median(rates["baseline"]), statistics.median(rates["ftq"])
    result("grpo_plain_trl_tokens_per_s", base, "tokens/s")
    spread = "/".join(f"{f / b:.2f}" for f, b in zip(rates["ftq"], rates["baseline"], strict=True))
    result(
        "grpo_ftq_tokens_per_s",
        ftq,
        "tokens/s",
        baseline="grpo_plain_trl_tokens_per_s",
        target=">=0.95",
        rounds=spread,
    )
    note(
        "GRPO on the small tiny model (4 layers, hidden 256), 1 CPU process, LoRA, "
        f"{BATCH // GENERATIONS} prompts x {GENERATIONS} "
        f"completions of {COMPLETION} tokens a step, {ns.steps} steps x {ns.rounds} rounds; tokens are TRL's "
        "count of prompt and completion tokens (generation and training); ftq scores the reward as a "
        "sandboxed python grader, the plain TRL script calls the same function in process"
    )


if __name__ == "__main__":
    main()
