"""An Idempotency-Key replay of POST /jobs (issue 48): answered from the stored job before the rate limit,
planning (paths, dataset preflight) and the active-jobs cap, so a client retrying after a lost response
gets its job; the same key with a different body is a 422 decided from the body as sent, unplanned."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import yaml

from ftq.runtime.settings import get_settings
from tests.harness.inprocess import MakeClient


def test_a_replay_is_answered_before_the_rate_limit_planning_and_the_cap(
    make_client: MakeClient, store_url: str, tiny_job: dict[str, Any], tiny_dir: Path
) -> None:
    client = make_client(store_url, max_active_jobs_per_owner="1", post_rate_per_minute="1")
    datasets = get_settings().data_path / "datasets"
    datasets.mkdir(parents=True)
    shutil.copy(tiny_dir / "data" / "train.jsonl", datasets / "train.jsonl")
    spec = copy.deepcopy(tiny_job)
    spec["dataset"]["name_or_path"] = "./datasets/train.jsonl"
    key = {"Idempotency-Key": "lost-response-1"}

    first = client.post("/jobs", json=spec, headers=key)
    assert first.status_code == 201, first.text
    assert "Idempotent-Replayed" not in first.headers
    job_id = first.json()["id"]

    # Past the rate (1 a minute), at the cap (1 active job), and with the dataset gone: planning the
    # spec again would be a 422, the cap a 429; the retry gets its job.
    (datasets / "train.jsonl").unlink()
    again = client.post("/jobs", json=spec, headers=key)
    assert again.status_code == 201, again.text
    assert again.json()["id"] == job_id
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Location"] == f"/jobs/{job_id}"
    # The same spec sent as YAML is the same request.
    as_yaml = client.post(
        "/jobs", content=yaml.safe_dump(spec), headers={**key, "Content-Type": "application/yaml"}
    )
    assert as_yaml.status_code == 201 and as_yaml.json()["id"] == job_id, as_yaml.text

    # A different body with the key: a 422 on the header, told without planning (its dataset is gone too).
    other = copy.deepcopy(spec)
    other["training"]["max_steps"] = 7
    r = client.post("/jobs", json=other, headers=key)
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == ["header", "Idempotency-Key"] and error["type"] == "idempotency_mismatch"

    # A new key is a new request, refused as before.
    r = client.post("/jobs", json=spec, headers={"Idempotency-Key": "lost-response-2"})
    assert r.status_code == 429, r.text
    assert [j["id"] for j in client.get("/jobs").json()["data"]] == [job_id]
