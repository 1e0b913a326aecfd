"""Fixtures for the SLURM tests: the real cluster that `.ci/slurm-setup.sh` brings up on this machine.

A test that needs the cluster asks for `slurm_cluster`; without an answering controller it fails (it is
never skipped): a SLURM test that silently does not run tests nothing. Helpers that poll it: cluster.py.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftq.settings import Settings
from worker.launchers.slurm import SlurmLauncher


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
