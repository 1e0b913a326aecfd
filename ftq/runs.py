"""What lives in a run directory `<FTQ_DATA_DIR>/runs/<job id>/`: the names both sides agree on."""

from __future__ import annotations

from pathlib import Path

SPEC = "spec.json"
ACCELERATE_CONFIG = "accelerate_config.yaml"
LAUNCH_SCRIPT = "launch.sh"
SBATCH_SCRIPT = "job.sbatch"
TRAIN_LOG = "train.log"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
FINAL = "final"
# Written by launch.sh / job.sbatch when the launch ends: the exit status as text, e.g. "0" or "137".
# How the service learns the end of a run it did not start itself (a restarted worker, or SLURM
# without accounting, where finished jobs leave squeue).
EXIT_STATUS = "exit_status"


def run_dir(runs_root: Path, job_id: str) -> Path:
    return runs_root / job_id
