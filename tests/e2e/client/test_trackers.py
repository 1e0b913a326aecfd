"""Experiment trackers end to end: a real `ftq up` whose operator settings say where runs log (W&B
offline, a real `mlflow server` on loopback), and the tiny job asking for all three trackers (the bank's
rich job, tests/e2e/bank.py). What each tracker holds is read back with its own format: MLflow's metric
history over its REST API, the offline W&B run file (protobuf records), TensorBoard's event files with
its EventAccumulator; each equals ftq's points from GET /jobs/{id}/metrics. The job shows its tracker
runs; nothing leaves loopback."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ftq.client import Client
from tests.e2e.bank import ALICE, EXPERIMENT, BankedRun
from tests.harness import Deployment

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dep(rich_job: BankedRun) -> Deployment:
    return rich_job.dep


@pytest.fixture(scope="module")
def mlflow_url(rich_job: BankedRun) -> str:
    return rich_job.bank.mlflow.url


@pytest.fixture(scope="module")
def job(rich_job: BankedRun) -> dict[str, Any]:
    return rich_job.job


def ftq_points(dep: Deployment, job_id: str, field: str) -> list[tuple[int, float]]:
    with Client(dep.url, ALICE) as client:
        return [
            (p.step, float(getattr(p, field)))
            for p in client.jobs.iter_metrics(job_id)
            if getattr(p, field) is not None
        ]


def test_the_job_shows_its_tracker_runs(job: dict[str, Any], mlflow_url: str) -> None:
    trackers = job["trackers"]
    assert set(trackers) == {"wandb", "mlflow", "tensorboard"}
    assert trackers["wandb"]["name"] == job["id"] and trackers["wandb"]["id"] == job["id"]
    assert trackers["wandb"]["mode"] == "offline" and trackers["wandb"]["url"] is None
    assert trackers["mlflow"]["name"] == job["id"] and trackers["mlflow"]["experiment"] == EXPERIMENT
    assert trackers["mlflow"]["url"].startswith(f"{mlflow_url}/#/experiments/")
    assert trackers["tensorboard"]["dir"] == "tensorboard"


def test_mlflow_holds_the_same_points(dep: Deployment, job: dict[str, Any], mlflow_url: str) -> None:
    run_id = job["trackers"]["mlflow"]["id"]

    def history(key: str) -> list[tuple[int, float]]:
        r = httpx.get(
            f"{mlflow_url}/api/2.0/mlflow/metrics/get-history", params={"run_id": run_id, "metric_key": key}
        )
        r.raise_for_status()
        return sorted((int(m["step"]), float(m["value"])) for m in r.json().get("metrics", []))

    loss = ftq_points(dep, job["id"], "loss")
    assert [s for s, _ in loss] == [1, 2, 3, 4]
    assert history("loss") == loss
    assert history("eval_loss") == ftq_points(dep, job["id"], "eval_loss")
    run = httpx.get(f"{mlflow_url}/api/2.0/mlflow/runs/get", params={"run_id": run_id}).json()["run"]
    assert run["info"]["status"] == "FINISHED" and run["info"]["run_name"] == job["id"]


def wandb_records(path: Path) -> Iterator[Any]:
    """The protobuf records of a W&B run file (`run-<id>.wandb`), read as W&B writes them: a 7-byte
    header (`:W&B`, magic, version), then LevelDB-log blocks of 32 KiB, each record a 7-byte header
    (CRC, length, type: full, first, middle, last) and its bytes."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, _magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B"
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # too little room for a header: the rest of the block is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            record.ParseFromString(pending)
            yield record
            pending = b""


def test_wandb_offline_files_hold_the_loss_history(dep: Deployment, job: dict[str, Any]) -> None:
    import json

    run_dir = dep.run_dir(job["id"])
    files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, list((run_dir / "wandb").rglob("*"))
    rows = []
    for record in wandb_records(files[0]):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
            )
    losses = [(int(r["train/global_step"]), float(r["train/loss"])) for r in rows if "train/loss" in r]
    assert losses == ftq_points(dep, job["id"], "loss")
    evals = [(int(r["train/global_step"]), float(r["eval/loss"])) for r in rows if "eval/loss" in r]
    assert evals == ftq_points(dep, job["id"], "eval_loss")


def test_tensorboard_event_files_hold_the_loss_history(dep: Deployment, job: dict[str, Any]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(dep.run_dir(job["id"]) / "tensorboard"))
    events.Reload()
    loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    expected = ftq_points(dep, job["id"], "loss")
    assert [s for s, _ in loss] == [s for s, _ in expected]
    # TensorBoard stores float32.
    assert [v for _, v in loss] == pytest.approx([v for _, v in expected], rel=1e-6)
