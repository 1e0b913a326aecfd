"""Trackers in the API, in process: a spec asking for a tracker the operator has not set up is a 422
naming it; a job shows the tracker runs its trainer recorded (trackers.json in its run directory), and
only those its spec asked for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.harness.inprocess import MakeClient

TRACKED = {"wandb": {"project": "p"}, "mlflow": {"experiment": "e"}, "tensorboard": True}


@pytest.mark.parametrize(
    ("integrations", "settings", "loc"),
    [
        ({"mlflow": {"experiment": "e"}}, {}, ["body", "integrations", "mlflow"]),
        ({"wandb": {"project": "p"}}, {}, ["body", "integrations", "wandb"]),
    ],
)
def test_a_tracker_the_operator_did_not_set_up_is_422(
    make_client: MakeClient,
    tiny_job: dict[str, Any],
    integrations: dict[str, Any],
    settings: dict[str, str],
    loc: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    r = make_client(**settings).post("/jobs", json={**tiny_job, "integrations": integrations})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc


def test_online_wandb_needs_the_operators_key(
    make_client: MakeClient, tiny_job: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "operator-key")
    r = make_client().post("/jobs", json={**tiny_job, "integrations": {"wandb": {"project": "p"}}})
    assert r.status_code == 201, r.text


def test_the_job_shows_what_its_trainer_recorded(
    make_client: MakeClient, ftq_env: dict[str, str], tiny_job: dict[str, Any]
) -> None:
    from ftq.store import repository
    from ftq.store.db import session_scope

    client = make_client(wandb_mode="offline", mlflow_tracking_uri="http://127.0.0.1:5000")
    job = client.post("/jobs", json={**tiny_job, "integrations": TRACKED}).json()
    assert job["trackers"] is None
    with session_scope() as s:
        assert repository.JOBS.mark_starting(s, job["id"], resources=None)
        s.commit()
    run = Path(ftq_env["FTQ_DATA_DIR"]) / "runs" / job["id"]
    run.mkdir(parents=True)
    assert client.get(f"/jobs/{job['id']}").json()["trackers"] is None  # not started yet
    record = {
        "wandb": {"project": "p", "name": job["id"], "id": job["id"], "url": None, "mode": "offline"},
        "mlflow": {"experiment": "e", "id": "abc", "name": job["id"], "url": "http://127.0.0.1:5000/#/x"},
        "tensorboard": {"dir": "tensorboard"},
        "comet": {"name": "not asked for"},
    }
    (run / "trackers.json").write_text(json.dumps(record))
    shown = client.get(f"/jobs/{job['id']}").json()["trackers"]
    assert set(shown) == {"wandb", "mlflow", "tensorboard"}
    assert shown["mlflow"]["id"] == "abc" and shown["wandb"]["mode"] == "offline"
    listed = client.get("/jobs").json()["data"][0]["trackers"]
    assert listed == shown
    (run / "trackers.json").unlink()
    (run / "trackers.json").symlink_to("/etc/hostname")  # the run's file to choose: never followed
    assert client.get(f"/jobs/{job['id']}").json()["trackers"] is None
