"""Each FSDP rank's host memory, read from outside, from the launch to the first logged step.

A random 532M-parameter Llama saved in bf16 (built once under /tmp), two CPU ranks, LoRA, the config ftq
renders (RAM-efficient loading: only rank 0 reads the weights), one step, under FSDP2 and FSDP1. Prints
each rank's peak PSS next to the model's size in float32 (FSDP's load dtype) and one rank's shard of it:
rank 1 should peak near its runtime plus its shard, far below rank 0, which reads the whole model.

    .venv/bin/python -m bench.rank_memory [--versions 2,1] [--mixed-precision no|bf16] [--timeline]
    .venv/bin/python -m bench.rank_memory --step-cost [--rounds 4]

Takes about a minute per FSDP version on two cores (plus half a minute to build the model once).
`--step-cost` prices what makes rank 1's figure: the trainer's fixed mmap threshold (every freed block of
1 MiB or more goes back to the kernel, so the next one is page-faulted in again), as the time of 10 bf16
training steps of a 17M Llama on one thread with it over the time without, alternating runs, the best
of each.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.integration.trainer.helpers import rendered_config
from tests.integration.trainer.rank_memory import MIB, build_llama, launch_measured, one_step_spec, write_rows

MODEL_DIR = Path(tempfile.gettempdir()) / "ftq-rank-memory" / "model"
TINY = Path(__file__).resolve().parents[1] / "examples" / "tiny" / "model"


def model_dir() -> tuple[Path, int]:
    """The 532M model under /tmp, built on first use; with its parameter count."""
    count_file = MODEL_DIR / "n_params"
    if not count_file.exists():
        MODEL_DIR.mkdir(parents=True, exist_ok=True)
        count_file.write_text(str(build_llama(MODEL_DIR, TINY)))
    return MODEL_DIR, int(count_file.read_text())


def job_spec(model: Path, data: Path, version: int, mixed_precision: str = "no") -> dict[str, Any]:
    """One LoRA step of two 16-token rows on two CPU ranks under FSDP `version`."""
    return {
        **one_step_spec(model, data, mixed_precision),
        "distributed": {"strategy": "fsdp", "fsdp": {"version": version}},
        "resources": {"device": "cpu", "processes_per_node": 2},
    }


STEPS = """
import sys, time
if sys.argv[1] == "fixed":
    from trainer.memory import return_freed_blocks_to_os
    assert return_freed_blocks_to_os()
import torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
torch.set_num_threads(1)
config = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                     num_key_value_heads=4, vocab_size=448)
model = LlamaForCausalLM(config)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, 448, (4, 128))
def step():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward(); opt.step(); opt.zero_grad()
for _ in range(3): step()
started = time.perf_counter()
for _ in range(10): step()
print(time.perf_counter() - started)
"""


def step_cost(rounds: int) -> None:
    repo = Path(__file__).resolve().parents[1]
    best = {"glibc": float("inf"), "fixed": float("inf")}
    for _ in range(rounds):
        for mode in best:
            out = subprocess.run(
                [sys.executable, "-c", STEPS, mode], cwd=repo, capture_output=True, text=True, check=True
            )
            best[mode] = min(best[mode], float(out.stdout.split()[-1]))
    print(
        f"10 bf16 steps, best of {rounds}: glibc's moving threshold {best['glibc']:.2f}s, fixed at 1 MiB "
        f"{best['fixed']:.2f}s: {best['fixed'] / best['glibc']:.2f}x the time"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default="2,1")
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16"])
    parser.add_argument("--timeline", action="store_true", help="print rank 1's PSS every second")
    parser.add_argument("--step-cost", action="store_true", help="time steps with and without the fix")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if args.step_cost:
        step_cost(args.rounds)
        return

    model, n_params = model_dir()
    full = n_params * 4 / MIB  # float32, FSDP's load dtype
    print(f"model: {n_params / 1e6:.0f}M parameters; float32 {full:.0f} MiB, a shard {full / 2:.0f} MiB")
    with tempfile.TemporaryDirectory(prefix="ftq-rank-memory-") as tmp:
        data = write_rows(Path(tmp) / "data.jsonl")
        for version in [int(v) for v in args.versions.split(",")]:
            work = Path(tmp) / f"fsdp{version}"
            work.mkdir()
            spec = job_spec(model, data, version, args.mixed_precision)
            proc, seen = launch_measured(spec, work, rendered_config(spec))
            if proc.returncode != 0:
                print(proc.stderr[-4000:])
                raise SystemExit(f"FSDP{version} launch failed ({proc.returncode})")
            p0, p1 = seen.peak_to_first_step[0], seen.peak_to_first_step[1]
            print(
                f"FSDP{version} ({args.mixed_precision}): peak PSS to the first step: rank 0 {p0:.0f} MiB, "
                f"rank 1 {p1:.0f} MiB (rank 1 / rank 0 {p1 / p0:.2f}); first step at "
                f"{seen.first_step_at:.0f}s; whole run: rank 0 {seen.peak_whole_run[0]:.0f}, "
                f"rank 1 {seen.peak_whole_run[1]:.0f} MiB"
            )
            if args.timeline:
                last = -1.0
                for t, mib in seen.samples[1]:
                    if t - last >= 1.0:
                        print(f"  rank 1 t={t:5.1f}s {mib:6.0f} MiB")
                        last = t


if __name__ == "__main__":
    main()
