"""Fixtures for the SLURM tests: the real cluster that `.ci/slurm-setup.sh` brings up on this machine.

A test that needs the cluster asks for `slurm_cluster`; without an answering controller it fails (it
is never skipped): a SLURM test that silently does not run tests nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from ftq.settings import Settings
from worker.launchers.base import RunPhase, RunRef, RunState
from worker.launchers.slurm import SlurmLauncher

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


@pytest.fixture(scope="session")
def slurm_cluster() -> list[str]:
    """The node names of the running test cluster; fails loudly when there is none."""
    hint = "start it with `sudo .ci/slurm-setup.sh` (installs slurm-wlm + munge, starts the daemons)"
    if shutil.which("scontrol") is None:
        pytest.fail(f"SLURM is not installed (no scontrol on PATH): {hint}", pytrace=False)
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`scontrol ping` did not answer in 20 s: {hint}", pytrace=False)
    if "is UP" not in ping.stdout:
        answer = (ping.stdout + ping.stderr).strip()
        pytest.fail(f"slurmctld does not answer `scontrol ping` ({answer}): {hint}", pytrace=False)
    sinfo = subprocess.run(
        ["sinfo", "--noheader", "--Node", "--format=%N %t"],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    up = ("idle", "mix", "alloc")
    nodes = [line.split()[0] for line in sinfo.stdout.splitlines() if line.split()[1] in up]
    if not nodes:
        pytest.fail(f"no SLURM node is up:\n{sinfo.stdout}\n{hint}", pytrace=False)
    return sorted(nodes)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", env="test")


@pytest.fixture
def launcher(slurm_cluster: list[str], settings: Settings) -> Iterator[SlurmLauncher]:
    launcher = SlurmLauncher(settings)
    yield launcher


@pytest.fixture
def cleanup_jobs() -> Iterator[list[str]]:
    """SLURM job ids to scancel after the test, whatever happened in it."""
    ids: list[str] = []
    yield ids
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, check=False)


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 60, every: float = 0.3) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def poll_one(launcher: SlurmLauncher, ref: RunRef) -> RunState:
    return launcher.poll([ref])[ref.job_id]


def wait_phase(launcher: SlurmLauncher, ref: RunRef, phases: set[RunPhase], timeout: float = 60) -> RunState:
    def look() -> RunState | None:
        state = poll_one(launcher, ref)
        return state if state.phase in phases else None

    return wait_for(f"job {ref.external_id} to be {sorted(phases)}", look, timeout)


def squeue_ids(*extra: str) -> set[str]:
    out = subprocess.run(
        ["squeue", "--noheader", "--format=%i", *extra], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


def procs_with(marker: str) -> list[int]:
    """Live processes whose command line holds `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if marker.encode() in cmd and state[state.rfind(")") + 2] not in "ZX":
            found.append(int(entry))
    return found
