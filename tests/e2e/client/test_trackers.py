"""Experiment trackers end to end: a real `ftq up` whose operator settings say where runs log (W&B
offline, a real `mlflow server` on loopback), and the tiny job asking for all three trackers (the bank's
rich job, tests/e2e/bank.py). What each tracker holds is read back with its own format: MLflow's metric
history over its REST API, the offline W&B run file (protobuf records), TensorBoard's event files with
its EventAccumulator; each equals ftq's points from GET /jobs/{id}/metrics. The job shows its tracker
runs; nothing leaves loopback.

Issue 28: the operator's URL carries credentials (finding 3), which no job, log, event or run file
shows; the trainer checks the server answers before the model loads (finding 6), and once the server is
down, a job trains on with a job.warning (FTQ_TRACKER_FAILURE=continue, the default)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ftq.client import Client
from tests.e2e.bank import ALICE, EXPERIMENT, MLFLOW_PASSWORD, BankedRun, MlflowServer
from tests.harness import TINY_RELATIVE, Deployment, tiny_spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dep(rich_job: BankedRun) -> Deployment:
    return rich_job.dep


@pytest.fixture(scope="module")
def mlflow_url(rich_job: BankedRun) -> str:
    return rich_job.bank.mlflow.url


@pytest.fixture(scope="module")
def mlflow_server(rich_job: BankedRun) -> MlflowServer:
    return rich_job.bank.mlflow


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


def test_the_operators_tracker_credentials_reach_no_tenant(dep: Deployment, job: dict[str, Any]) -> None:
    """Finding 3: the password is in no API answer (the job, its logs, its events) and in no file of the
    run (train.log, trackers.json, the launch script): the trainer got it in its environment only."""
    import json

    answers = [
        json.dumps(job),
        json.dumps(dep.get(f"/jobs/{job['id']}/logs")),
        json.dumps(dep.get(f"/jobs/{job['id']}/events")),
    ]
    for text in answers:
        assert MLFLOW_PASSWORD not in text and "ftq-op" not in text
    run_dir = dep.run_dir(job["id"])
    for path in run_dir.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_size < 50_000_000:
            assert MLFLOW_PASSWORD.encode() not in path.read_bytes(), path


def test_the_reachability_check_finds_the_real_server(mlflow_url: str) -> None:
    from trainer import trackers

    assert trackers.probe(mlflow_url, 5.0) is None


def test_with_the_server_down_a_job_trains_on_and_warns(
    dep: Deployment, job: dict[str, Any], mlflow_server: MlflowServer
) -> None:
    """Finding 6, last in this module: it stops the bank's MLflow server. The port is then closed; the
    job does not spend minutes in MLflow's retries, it trains on (continue) and says why in a
    job.warning."""
    mlflow_server.stop()  # the bank's: no later test reads MLflow (the bank's teardown stops it again)
    spec = tiny_spec(TINY_RELATIVE, name="tracker-down", max_steps=2)
    spec["integrations"] = {"mlflow": {"experiment": EXPERIMENT}}
    posted = dep.post_job(spec)
    done = dep.wait_terminal(posted["id"], timeout=400)
    assert done["status"] == "succeeded", dep.report(posted["id"])
    events = dep.get(f"/jobs/{posted['id']}/events")["data"]
    warnings = [e for e in events if e["type"] == "job.warning"]
    assert [w["data"]["kind"] for w in warnings] == ["tracker_unreachable"], events
    message = warnings[0]["data"]["message"]
    assert (
        "FTQ_MLFLOW_TRACKING_URI" in message
        and mlflow_server.url in message
        and MLFLOW_PASSWORD not in message
    )
    assert [s for s, _ in ftq_points(dep, posted["id"], "loss")] == [1, 2]  # every metric kept in ftq


def test_every_name_ftq_made_in_its_data_dir_is_out_of_a_specs_reach(
    dep: Deployment, job: dict[str, Any]
) -> None:
    """Issue 28, finding 1, for names added later too: after a real `ftq up` ran a job (and listed its
    artifacts, which hashes them), everything at the top of its data dir is ftq's (DATA_DIR_STATE), and
    the one path rule refuses each of them from its name."""
    from ftq.runtime.settings import DATA_DIR_STATE
    from service.paths import PathRefused, StateRule

    assert dep.get(f"/jobs/{job['id']}/artifacts")["data"]
    rule = StateRule(dep.data_dir, dep.data_dir / "runs")
    made = sorted(p.name for p in dep.data_dir.iterdir())
    assert {"runs", "ftq.db", "artifact-hashes"} <= set(made), made
    for name in made:
        assert any(name == s or name.startswith((s + "-", s + ".")) for s in DATA_DIR_STATE), name
        with pytest.raises(PathRefused):
            rule((dep.data_dir / name).resolve(), f"./{name}")
