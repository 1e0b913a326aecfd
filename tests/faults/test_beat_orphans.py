"""A worker killed with SIGKILL leaves no scheduler behind.

`celery worker --beat` forks its beat; killed with SIGKILL, the worker cannot stop it, and before the fix
the orphan ticked on forever: each worker restart added one more, each sending every sweep again, until
the embedded broker's queue held tens of thousands of messages and jobs stayed `running` long after
their runs ended (found by bench/fault_series.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.fault_series import pid_alive, proc_children

REPO = Path(__file__).resolve().parents[2]
FTQ = str(Path(sys.executable).parent / "ftq")

pytestmark = pytest.mark.slow


def test_sigkill_of_the_worker_ends_its_beat(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTQ_") or k.startswith("FTQ_TEST_")}
    env.update({"FTQ_ENV": "test", "FTQ_DATA_DIR": str(tmp_path / "data")})
    log = tmp_path / "worker.log"
    beat: list[int] = []
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [FTQ, "worker"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.time() + 120
        # The beat must be up and ticking (not merely started) before the worker is killed.
        while time.time() < deadline and not beat:
            if log.read_text(errors="replace").count("Sending due task") >= 3:
                beat = proc_children(worker.pid)
            time.sleep(0.2)
        assert beat and all(pid_alive(p) for p in beat), log.read_text(errors="replace")[-3000:]
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        deadline = time.time() + 15
        while time.time() < deadline and any(pid_alive(p) for p in beat):
            time.sleep(0.1)
        assert not any(pid_alive(p) for p in beat), f"beat {beat} outlived its worker"
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        for pid in beat:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
