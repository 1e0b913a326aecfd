"""CPU seconds per test, for finding what makes the suite long (not loaded unless asked for):

    python -m pytest -p tests.harness.cpuprof -n 3 --dist loadgroup     # FTQ_TEST_CPU_LOG=cpu.jsonl

Each xdist worker (or the one pytest process) moves itself into a cpuacct cgroup of its own (cgroup v1,
as on the 2-core machine; needs root), which every process it starts inherits: the servers, the
`accelerate launch` runs and their ranks. Before and after each test (setup and teardown included) the
group's usage is read, so a test's line counts the CPU of everything that ran for it, whatever the
other workers did meanwhile (a shared fixture is counted in the first test that asks for it). One JSON
line a test: node id, CPU seconds, the worker's own share of them (the test's in-process work: its
code, TestClient apps, HTTP polling), wall seconds, worker. Processes that SLURM starts are in slurmd's
group, not the test's.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path("/sys/fs/cgroup/cpuacct/ftq-test-cpu")
LOG = Path(os.environ.get("FTQ_TEST_CPU_LOG", "cpu.jsonl"))
_group: Path | None = None


def _usage() -> float:
    assert _group is not None
    return int((_group / "cpuacct.usage").read_text()) / 1e9


def pytest_configure(config: pytest.Config) -> None:
    global _group
    _group = ROOT / os.environ.get("PYTEST_XDIST_WORKER", "main")
    _group.mkdir(parents=True, exist_ok=True)
    (_group / "cgroup.procs").write_text(str(os.getpid()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    cpu, own, wall = _usage(), time.process_time(), time.monotonic()
    yield
    line = {
        "id": item.nodeid,
        "cpu": round(_usage() - cpu, 2),
        "self": round(time.process_time() - own, 2),
        "wall": round(time.monotonic() - wall, 2),
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
    }
    with LOG.open("a") as out:
        out.write(json.dumps(line) + "\n")
