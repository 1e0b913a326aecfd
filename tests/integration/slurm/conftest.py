"""Fixtures for the SLURM tests: the real cluster that `.ci/slurm-setup.sh` brings up on this machine.

A test that needs the cluster asks for `slurm_cluster`; without an answering controller it fails (it is
never skipped): a SLURM test that silently does not run tests nothing. Helpers that poll it: cluster.py.
The `ftq up` whose jobs go to the cluster (`slurm_stack`) serves every module of this folder.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftq.runtime.settings import Settings
from tests.harness import EXAMPLES, QUICK_SETTINGS, Deployment, Job
from tests.integration.slurm.cluster import slurm_spec
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


@pytest.fixture(scope="package")
def slurm_stack(
    slurm_cluster: list[str], tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    """`ftq up` on its embedded defaults; SLURM jobs read and write its data dir (this host's disk is
    the storage the two test "nodes" share). Each test reads its own jobs (and `slurm_succeeded`)."""
    root = tmp_path_factory.mktemp("ftq-slurm")
    dep = Deployment(root, settings={**QUICK_SETTINGS, "local_roots": f"{EXAMPLES}:{root / 'data'}"})
    try:
        with dep:
            yield dep
    finally:
        # A failed test must not leave its batch jobs (or its exports') on the cluster.
        records = list((dep.data_dir / "runs").glob("*/launch.json"))
        records += list((dep.data_dir / "runs").glob("*/exports/*/launch.json"))
        ids = [str(json.loads(p.read_text()).get("external_id") or "") for p in records]
        if any(ids):
            subprocess.run(["scancel", *[i for i in ids if i]], capture_output=True, check=False)


@pytest.fixture(scope="package")
def slurm_succeeding(slurm_stack: Deployment, tiny_dir: Path) -> Job:
    """The tiny job (4 steps) posted to SLURM, as posted (it runs while the test that asks first goes
    on); test_slurm_deployment checks how it ran, test_slurm_export exports it once it has succeeded."""
    return slurm_stack.post_job(slurm_spec(tiny_dir, max_steps=4, name="slurm-ok"))
