"""Trainer throughput on CPU: packing against none, and ftq's trainer against a plain TRL SFT script.

    python -m bench.trainer_bench [--steps 24] [--rounds 3] [--out bench/out/trainer]

Builds the `small` tiny model (4 layers, hidden 256) and its mixed-length text data, then runs, one
process each and one after another, with the same settings:
  baseline   a plain TRL SFTTrainer script (this file, --baseline), packing on
  trainer    `python -m trainer --spec ...`, packing on
  no-pack    `python -m trainer --spec ...`, packing off (padded batches)
Throughput is non-padding tokens per second over the steps after the first two (warm-up), median of
the per-log-step rates of all rounds; everything is printed as a ratio against the baseline of the same
run, since absolute CPU numbers mean little on a shared machine. Results go to OUT/results.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import OUT

REPO = Path(__file__).resolve().parent.parent
SEQ_LEN = 256
BATCH = 4
LR = 1e-3


def spec(tiny: Path, steps: int, packing: bool) -> dict[str, Any]:
    return {
        "model": {"name_or_path": str(tiny / "model"), "attn_implementation": "sdpa"},
        "dataset": {"name_or_path": str(tiny / "data" / "train.jsonl"), "text_field": "text"},
        "training": {
            "max_seq_len": SEQ_LEN,
            "max_steps": steps,
            "per_device_train_batch_size": BATCH,
            "learning_rate": LR,
            "lr_scheduler_type": "constant",
            "logging_steps": 1,
            "save_steps": None,
            "packing": packing,
            "mixed_precision": "no",
            "seed": 0,
        },
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
        "resources": {"device": "cpu"},
    }


def baseline(tiny: Path, steps: int, out: Path) -> None:
    """The plain TRL script: what a user would write by hand with the same settings."""
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    rates: list[dict[str, float]] = []

    class Clock(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                rates.append(
                    {"step": state.global_step, "time": time.time(), "tokens": state.num_input_tokens_seen}
                )

    tok = AutoTokenizer.from_pretrained(tiny / "model")
    model = AutoModelForCausalLM.from_pretrained(tiny / "model", attn_implementation="sdpa")
    ds = load_dataset("json", data_files=str(tiny / "data" / "train.jsonl"), split="train")
    config = SFTConfig(
        output_dir=str(out / "baseline-ckpt"),
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=LR,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        max_length=SEQ_LEN,
        packing=True,
        use_cpu=True,
        # TRL's defaults are bf16 and gradient checkpointing on; the spec above asks for neither
        # (mixed_precision "no", gradient_checkpointing false), so say so or the comparison is unfair.
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        seed=0,
        include_num_input_tokens_seen="non_padding",
        disable_tqdm=True,
    )
    lora = LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=ds,
        processing_class=tok,
        peft_config=lora,
        callbacks=[Clock()],
    )
    trainer.train()
    (out / "baseline.json").write_text(json.dumps(rates))


def rates_from_clock(path: Path) -> list[float]:
    marks = json.loads(path.read_text())
    return [(b["tokens"] - a["tokens"]) / (b["time"] - a["time"]) for a, b in itertools.pairwise(marks)]


def rates_from_metrics(path: Path) -> list[float]:
    pts = [json.loads(line) for line in path.read_text().splitlines()]
    return [p["tokens_per_second"] for p in pts if p.get("tokens_per_second")]


def run(cmd: list[str]) -> float:
    started = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    return time.time() - started


RUNS = ["baseline", "trainer", "no-pack"]


def run_one(name: str, tiny: Path, steps: int, out: Path) -> tuple[float, list[float]]:
    """One run of a contender: its wall seconds and its per-log-step tokens/s."""
    if name == "baseline":
        wall = run(
            [
                sys.executable,
                "-m",
                "bench.trainer_bench",
                "--baseline",
                "--steps",
                str(steps),
                "--out",
                str(out),
                "--tiny",
                str(tiny),
            ]
        )
        return wall, rates_from_clock(out / "baseline.json")
    run_dir = out / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir()
    spec_path = run_dir / "spec.json"
    spec_path.write_text(json.dumps(spec(tiny, steps, packing=name == "trainer")))
    wall = run(
        [sys.executable, "-m", "trainer", "--spec", str(spec_path), "--output_dir", str(run_dir / "out")]
    )
    return wall, rates_from_metrics(run_dir / "out" / "metrics.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3, help="each contender this many times, in turn")
    parser.add_argument("--out", type=Path, default=OUT / "trainer")
    parser.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tiny", type=Path, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    out: Path = ns.out
    tiny = ns.tiny or out / "tiny-small"
    if ns.baseline:
        baseline(tiny, ns.steps, out)
        return

    out.mkdir(parents=True, exist_ok=True)
    if not (tiny / "model" / "model.safetensors").exists():
        run([sys.executable, "-m", "trainer.tiny", "--out", str(tiny), "--size", "small"])

    walls: dict[str, list[float]] = {name: [] for name in RUNS}
    rates: dict[str, list[float]] = {name: [] for name in RUNS}
    for r in range(ns.rounds):
        # Each round in another order, so that a slow spell on a shared machine, or whatever the first
        # run of a round pays, does not always land on the same contender.
        order = RUNS[r % len(RUNS) :] + RUNS[: r % len(RUNS)]
        for name in order:
            wall, step_rates = run_one(name, tiny, ns.steps, out)
            walls[name].append(wall)
            # The first two steps include warm-up (allocations, first packing); leave them out.
            rates[name] += step_rates[2:] if len(step_rates) > 4 else step_rates
            print(
                f"round {r + 1} {name}: {statistics.median(step_rates):.0f} tok/s, {wall:.1f} s", flush=True
            )

    # The first two steps include warm-up (allocations, first packing); leave them out.
    median = {name: statistics.median(r) for name, r in rates.items()}
    base = median["baseline"]
    results = {
        "settings": {
            "steps": ns.steps,
            "rounds": ns.rounds,
            "seq_len": SEQ_LEN,
            "batch": BATCH,
            "model": "tiny small (4x256)",
        },
        "tokens_per_second": median,
        "ratio_vs_baseline": {name: value / base for name, value in median.items()},
        "packing_speedup": median["trainer"] / median["no-pack"],
        "wall_seconds": walls,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"{'run':<10} {'tokens/s':>10} {'x baseline':>11} {'wall s':>8}")
    for name in ("baseline", "trainer", "no-pack"):
        wall = statistics.median(walls[name])
        print(f"{name:<10} {median[name]:>10.0f} {median[name] / base:>11.2f} {wall:>8.1f}")
    print(f"packing speedup (trainer packed / trainer unpacked): {results['packing_speedup']:.2f}x")


if __name__ == "__main__":
    main()
