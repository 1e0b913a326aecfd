"""tests.harness.procs.Paced: the pacing the fault tests rely on to keep a run training slowly."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.harness.procs import Paced, cpu_seconds, run_pids

BUSY = "while True: pass"


def test_a_paced_run_gets_a_fraction_of_the_cpu_and_runs_freely_after() -> None:
    job_id = f"job_paced_{os.getpid()}"
    proc = subprocess.Popen([sys.executable, "-c", BUSY], env={**os.environ, "FTQ_JOB_ID": job_id})
    try:
        deadline = time.monotonic() + 10
        while proc.pid not in run_pids(job_id):
            assert time.monotonic() < deadline, "the marked process never showed"
            time.sleep(0.05)
        pace = Paced(job_id, share=0.1, period=0.1)
        time.sleep(0.5)  # its first scan and a few periods
        before, start = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(1.5)
        paced_share = (cpu_seconds(proc.pid) - before) / (time.monotonic() - start)
        pace.stop()
        # Left running, not stopped: its state is R (or S between time slices), never T.
        state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert state != "T", state
        before, start = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(1.0)
        free_share = (cpu_seconds(proc.pid) - before) / (time.monotonic() - start)
        # A tenth asked for; generous bounds, as the machine may be busy with other tests.
        assert paced_share < 0.35, paced_share
        assert free_share > 2 * paced_share, (free_share, paced_share)
    finally:
        proc.kill()
        proc.wait()
