"""An idle deployment's beat: CPU seconds of the periodic scheduler (a real `celery beat` process on the
embedded broker, ftq's four sweeps every second as in tests/harness's QUICK_SETTINGS) with ftq's scheduler
(worker/beat.py) against Celery's own, and the sweeps each sent.

    python -m bench.beat_bench [--rounds 3] [--seconds 20]

Each round runs both for the same time, in alternating order; the figure is the median over the rounds
of the process's CPU (/proc, from its first sweep sent to the end of the window, so start-up is left
out). Both must send the same sweeps: the bench fails if ftq's sends fewer.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import REPO, alternated, note, result, scratch
from tests.harness import QUICK_SETTINGS, clean_env, wait_until
from tests.harness.env import ftq_settings
from tests.harness.procs import cpu_seconds

SCHEDULERS = {"ftq": "worker.beat:Scheduler", "celery": "celery.beat:Scheduler"}


def _sent(queue: Path) -> int:
    return sum(1 for name in os.listdir(queue) if name.endswith(".msg")) if queue.is_dir() else 0


def measure(root: Path, scheduler: str, seconds: float) -> tuple[float, int]:
    """(CPU seconds, sweeps sent) of one beat process over `seconds` after its first sweep."""
    data = root / "data"
    shutil.rmtree(data, ignore_errors=True)
    env = clean_env(FTQ_ENV="test", FTQ_DATA_DIR=str(data))
    env.update(ftq_settings(QUICK_SETTINGS))
    argv = [sys.executable, "-m", "celery", "-A", "worker.celery_app:celery_app", "--quiet", "beat"]
    argv += ["--scheduler", scheduler, "--loglevel", "WARNING"]
    with open(root / "beat.log", "ab") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        queue = data / "broker" / "queue"  # Settings.state_path("broker") under FTQ_DATA_DIR
        wait_until(f"the beat's first sweep (see {root / 'beat.log'})", lambda: _sent(queue))
        cpu0, sent0 = cpu_seconds(proc.pid), _sent(queue)
        time.sleep(seconds)
        return cpu_seconds(proc.pid) - cpu0, _sent(queue) - sent0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    root = scratch("beat-")
    sent: dict[str, list[int]] = {name: [] for name in SCHEDULERS}

    def cpu_of(name: str, round_: int) -> float:
        cpu, swept = measure(root, SCHEDULERS[name], args.seconds)
        sent[name].append(swept)
        return cpu

    cpu = alternated(args.rounds, list(SCHEDULERS), cpu_of)
    shutil.rmtree(root, ignore_errors=True)
    ours, theirs = cpu["ftq"], cpu["celery"]
    sent_ours, sent_theirs = statistics.median(sent["ftq"]), statistics.median(sent["celery"])
    if sent_ours < 0.9 * sent_theirs:
        raise SystemExit(f"ftq's scheduler sent {sent_ours} sweeps against Celery's {sent_theirs}")
    per_minute = 60 / args.seconds
    note(
        f"A `celery beat` process on the embedded broker, four sweeps a second, median of {args.rounds}"
        f" rounds of {args.seconds:g} s: {ours * per_minute:.2f} CPU-s a minute with worker/beat.py's"
        f" scheduler against {theirs * per_minute:.2f} with Celery's own ({sent_ours:.0f} and"
        f" {sent_theirs:.0f} sweeps sent)."
    )
    result("beat_celery_cpu_per_min", theirs * per_minute, "s")
    result("beat_ftq_cpu_per_min", ours * per_minute, "s", baseline="beat_celery_cpu_per_min", target="<0.5")


if __name__ == "__main__":
    main()
