"""Checkpoint before the end (trainer/preempt.py): a stop signal that reaches one rank only stops all of
them after the same step, with one complete checkpoint, and the run exits with the `ftq-error:` line the
service requeues on. Two real CPU processes under `accelerate launch` (torchrun's agent), the signal sent
to rank 1 alone, as SLURM's warning or a cancel may reach the ranks at different moments."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from ftq.contract import runs
from ftq.contract.spec import JobSpec
from ftq.planning.render import accelerate_config, config_yaml
from tests.harness import REPO, tiny_spec, wait_until
from tests.integration.trainer.helpers import accelerate_command, explain, points, trainer_env, write_spec
from trainer.preempt import EXIT_CHECKPOINTED

pytestmark = pytest.mark.slow


def rank_pid(run_dir: Path, rank: int) -> int | None:
    """The trainer process of `rank` in this run (its environment says RANK=<rank>)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if (
            str(run_dir).encode() in cmd
            and b"\0-m\0trainer\0" in b"\0" + cmd
            and f"\0RANK={rank}\0".encode() in b"\0" + env
        ):
            return int(entry.name)
    return None


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM], ids=["SIGUSR1", "SIGTERM"])
def test_a_signal_to_one_rank_stops_both_after_the_same_step_with_a_checkpoint(
    tiny_dir: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    body = tiny_spec(tiny_dir, max_steps=100_000, processes=2)  # it would run for hours: only a stop ends it
    spec = JobSpec.model_validate(body)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = run_dir / runs.ACCELERATE_CONFIG
    cfg.write_text(config_yaml(accelerate_config(spec)))
    spec_path = write_spec(run_dir / runs.SPEC, body)
    env = trainer_env()
    # As job.sbatch exports them: the agent forwards SIGUSR1 too, and gives the ranks time to save.
    env.update(
        PET_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", TORCH_ELASTIC_SHUTDOWN_TIMEOUT="120"
    )
    cmd = accelerate_command(cfg)
    cmd += ["-m", "trainer", "--spec", str(spec_path), "--output_dir", str(run_dir)]
    with subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            wait_until(
                "three logged steps",
                lambda: (run_dir / runs.METRICS).is_file() and len(points(run_dir)) >= 3,
                240,
            )
            rank1 = wait_until("rank 1's process", lambda: rank_pid(run_dir, 1), 10)
            os.kill(rank1, sig)
            out, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    assert proc.returncode != 0, explain(done)

    steps = [p["step"] for p in points(run_dir)]
    assert steps == list(range(1, len(steps) + 1)), steps
    stopped_at = steps[-1]
    # One checkpoint, at the step both ranks stopped after, complete enough to resume from.
    assert [(c.step, c.resumable) for c in runs.list_checkpoints(run_dir)] == [(stopped_at, True)], explain(
        done
    )
    code = "time_limit" if sig == signal.SIGUSR1 else "preempted"
    line = f"ftq-error: {code}: stopped after step {stopped_at} because"
    assert line in err and f"checkpoints/checkpoint-{stopped_at};" in err, explain(done)
    # Both ranks took the checkpointing exit (torch's agent lists each rank's code), though rank 0 never
    # got the signal itself; neither was killed.
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", err)
    assert len(codes) >= 2 and set(codes) == {str(EXIT_CHECKPOINTED)}, explain(done)
    assert not (run_dir / runs.FINAL).exists()
