"""Running the trainer's real entry point as processes (alone, or under `accelerate launch` on two CPU
processes), and reading what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftq.planning.render import ACCELERATE_LAUNCH as LAUNCH_MODULE
from tests.harness import REPO, free_port

# What the worker and job.sbatch run: accelerate's launch command as a module. The `accelerate` script
# runs the same command, but first imports all of accelerate's others (`estimate-memory` imports
# transformers): about 1.2 CPU-s more a launch. ACCELERATE_CLI is the articles' `accelerate launch`, for
# their own command line.
ACCELERATE_LAUNCH = [sys.executable, *LAUNCH_MODULE]
ACCELERATE_CLI = [str(Path(sys.executable).with_name("accelerate")), "launch"]


def rendered_config(spec: dict[str, Any]) -> str:
    """The accelerate config ftq renders for this spec, as a launch of the trainer reads it."""
    from ftq.contract.spec import JobSpec
    from ftq.planning import render

    return render.config_yaml(render.accelerate_config(JobSpec.model_validate(spec)))


# Hand-written configs for launches that do not go through a spec (train.py's command line), or that
# pin a setting ftq renders otherwise (ZeRO-3 without 16-bit gathering).
_TWO_CPU_PROCESSES = """\
compute_environment: LOCAL_MACHINE
use_cpu: true
num_processes: 2
num_machines: 1
machine_rank: 0
mixed_precision: 'no'
rdzv_backend: static
same_network: true
"""

# In bf16: FSDP2's mixed-precision policy on the CPU (torch's CPU kernels compute in bf16).
ACCELERATE_FSDP2_CPU = (
    _TWO_CPU_PROCESSES.replace("mixed_precision: 'no'", "mixed_precision: bf16")
    + """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_offload_params: false
  fsdp_activation_checkpointing: false
"""
)

# The same on one process: a resume of a two-process FSDP2 checkpoint onto another world size.
ACCELERATE_FSDP2_ONE_CPU = ACCELERATE_FSDP2_CPU.replace("num_processes: 2", "num_processes: 1")

# ZeRO-3 in bf16, as the Falcon job trains.
ACCELERATE_ZERO3_CPU = (
    _TWO_CPU_PROCESSES.replace("mixed_precision: 'no'", "mixed_precision: bf16")
    + """\
distributed_type: DEEPSPEED
deepspeed_config:
  zero_stage: 3
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: true
  zero3_save_16bit_model: false
  deepspeed_multinode_launcher: standard
"""
)


# Sample prompts (spec `eval.sample_prompts`) for the runs that generate while they train.
SAMPLE_PROMPTS = ["one two three", "seven eight"]
SAMPLE_NEW_TOKENS = 6


def with_samples(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` asking for SAMPLE_PROMPTS' completions while it trains."""
    return {**spec, "eval": {"sample_prompts": SAMPLE_PROMPTS, "sample_max_new_tokens": SAMPLE_NEW_TOKENS}}


def trainer_env() -> dict[str, str]:
    env = dict(os.environ)
    # Offline on purpose: every model and dataset in these tests is a local path.
    env.update(
        HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO)
    )
    # One thread a process, as torchrun gives each rank of a multi-process launch: on the tiny model a
    # second intra-op thread only spins (about 1 s of CPU a run), taking the core another run could use.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_trainer(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """`python -m trainer ARGS` as one process."""
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        cwd=REPO,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_trainers(*argvs: list[str], timeout: int = 600) -> list[subprocess.CompletedProcess[str]]:
    """`python -m trainer ARGS` for each ARGS, side by side; their results in the same order. A run of
    the tiny model is mostly its imports, on one CPU: two at once take about the time of one."""
    with ThreadPoolExecutor(len(argvs)) as pool:
        return list(pool.map(lambda args: run_trainer(args, timeout), argvs))


def accelerate_command(cfg: Path, launcher: list[str] = ACCELERATE_LAUNCH) -> list[str]:
    """The launch with accelerate config `cfg` on a free rendezvous port, up to the module it runs."""
    return [*launcher, "--config_file", str(cfg), "--main_process_port", str(free_port())]


def launch_trainer(
    config_yaml: str,
    workdir: Path,
    args: list[str],
    timeout: int = 600,
    launcher: list[str] = ACCELERATE_LAUNCH,
) -> subprocess.CompletedProcess[str]:
    """`accelerate launch --config_file CFG -m trainer ARGS` (two CPU processes in the configs here), as
    the worker starts it unless `launcher` says otherwise."""
    cfg = workdir / "accelerate_config.yaml"
    cfg.write_text(config_yaml)
    cmd = [*accelerate_command(cfg, launcher), "-m", "trainer", *args]
    return subprocess.run(cmd, cwd=REPO, env=trainer_env(), capture_output=True, text=True, timeout=timeout)


def launch_spec(
    spec: dict[str, Any], workdir: Path, config_yaml: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`spec` launched as the worker launches a job (spec.json, ftq's rendered accelerate config unless
    `config_yaml` is given) on two CPU processes; the run directory is `workdir/run`."""
    args = ["--spec", str(write_spec(workdir / "spec.json", spec)), "--output_dir", str(workdir / "run")]
    return launch_trainer(config_yaml or rendered_config(spec), workdir, args)


@dataclass(frozen=True)
class Run:
    """A finished launch that several tests read."""

    out: Path  # the run directory
    log: str  # the launch's stderr: every rank's log lines


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(json.dumps(spec))
    return path


def points(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    tail_out, tail_err = proc.stdout[-3000:], proc.stderr[-6000:]
    return f"exit {proc.returncode}\n--- stdout tail\n{tail_out}\n--- stderr tail\n{tail_err}"
