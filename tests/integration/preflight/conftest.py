"""Preflight and failures through a real `ftq up`: its data dir holds the Llama 2 70B and Falcon 180B
config.json files (no weights) next to what the runs write; the tiny assets are an allowed root too.
Mounts and cgroups a test makes are removed by that test. The checkpoint and failure tests share one
plain `ftq up` (`quick_up`): each reads only the jobs it posted."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import MODEL_CONFIGS, Deployment
from tests.integration.preflight.deployments import running_up


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir holding only the config.json files of the 70B and 180B example models (no weights)."""
    data = tmp_path_factory.mktemp("ftq-pf") / "data"
    for name, fixture in (("llama-2-70b", "llama-2-70b-hf"), ("falcon-180B", "falcon-180B")):
        folder = data / "models" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text((MODEL_CONFIGS / fixture / "config.json").read_text())
    return data


@pytest.fixture(scope="module")
def stack(models_root: Path, tiny_dir: Path) -> Iterator[Deployment]:
    # allow_oversubscribe skips the disk check too here, as the test of launching anyway needs (a 70B
    # full fine-tune's checkpoints do not fit this disk).
    # Eight GPUs in the local pool, as the 70B and 180B examples ask for per node (a local cuda job is refused
    # at POST where the pool has fewer).
    with running_up(
        models_root.parent,
        tiny_dir,
        data_dir=models_root,
        allow_oversubscribe="true",
        gpu_pool="0,1,2,3,4,5,6,7",
    ) as dep:
        yield dep


@pytest.fixture(scope="package")
def quick_up(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[Deployment]:
    """`ftq up` with quick sweeps on its own data dir, the tiny assets an allowed root. Its MLflow server
    (with the operator's credentials in the URL) is a closed port, and a tracker that is down fails a
    job (FTQ_TRACKER_FAILURE=fail): only a job asking for MLflow sees either."""
    with running_up(
        tmp_path_factory.mktemp("ftq-running"),
        tiny_dir,
        mlflow_tracking_uri=f"http://ftq-op:{TRACKER_PASSWORD}@127.0.0.1:{closed_port()}",
        tracker_failure="fail",
        tracker_check_seconds="3",
    ) as dep:
        yield dep


TRACKER_PASSWORD = "op-s3cret-pw"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
