"""A worker killed with SIGKILL leaves no scheduler behind.

`celery worker --beat` forks its beat; killed with SIGKILL, the worker cannot stop it, and before the fix
the orphan ticked on forever: each worker restart added one more, each sending every sweep again, until
the embedded broker's queue held tens of thousands of messages and jobs stayed `running` long after
their runs ended (found by bench/fault_series.py).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.harness import Deployment, pid_alive, proc_children

pytestmark = pytest.mark.slow


def test_sigkill_of_the_worker_ends_its_beat(tmp_path: Path) -> None:
    # The beat's "Sending due task" lines, which tell that it ticks, are logged at DEBUG only.
    with Deployment(tmp_path, mode="worker", settings={"log_level": "DEBUG"}) as dep:
        log = dep.worker_log
        beat: list[int] = []
        deadline = time.time() + 120
        # The beat must be up and ticking (not merely started) before the worker is killed.
        while time.time() < deadline and not beat:
            if log.read_text(errors="replace").count("Sending due task") >= 3:
                beat = proc_children(dep.pid("worker"))
            time.sleep(0.2)
        try:
            assert beat and all(pid_alive(p) for p in beat), log.read_text(errors="replace")[-3000:]
            dep.kill9("worker")
            deadline = time.time() + 15
            while time.time() < deadline and any(pid_alive(p) for p in beat):
                time.sleep(0.1)
            assert not any(pid_alive(p) for p in beat), f"beat {beat} outlived its worker"
        finally:
            for pid in beat:
                if pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)
