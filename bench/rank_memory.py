"""Each FSDP rank's host memory, read from outside, from the launch to the first logged step.

A random 532M-parameter Llama saved in bf16 (built once under /tmp), two CPU ranks, LoRA, the config ftq
renders (RAM-efficient loading: only rank 0 reads the weights), one step, under FSDP2 and FSDP1. Prints
each rank's peak PSS next to the model's size in float32 (FSDP's load dtype) and one rank's shard of it:
rank 1 should peak near its runtime plus its shard, far below rank 0, which reads the whole model.

    .venv/bin/python -m bench.rank_memory [--versions 2,1] [--mixed-precision no|bf16] [--timeline]

Takes about a minute per FSDP version on two cores (plus half a minute to build the model once).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from tests.integration.trainer.helpers import rendered_config
from tests.integration.trainer.rank_memory import MIB, build_llama, launch_measured

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
        "model": {"name_or_path": str(model)},
        "dataset": {"name_or_path": str(data)},
        "training": {
            "max_seq_len": 16,
            "max_steps": 1,
            "per_device_train_batch_size": 1,
            "learning_rate": 1e-3,
            "logging_steps": 1,
            "save_steps": None,
            "packing": False,
            "gradient_checkpointing": False,
            "mixed_precision": mixed_precision,
            "seed": 1,
        },
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "distributed": {"strategy": "fsdp", "fsdp": {"version": version}},
        "resources": {"device": "cpu", "processes_per_node": 2},
    }


def write_rows(path: Path) -> Path:
    row = json.dumps({"text": "one two three four five six seven eight nine ten"})
    path.write_text((row + "\n") * 2)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default="2,1")
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16"])
    parser.add_argument("--timeline", action="store_true", help="print rank 1's PSS every second")
    args = parser.parse_args()

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
