"""Training methods through HTTP on a real `ftq up` (issue 16): a DPO job with LoRA on a local preference
file succeeds on one CPU process, its plan names trl.DPOTrainer and GET /jobs/{id}/metrics carries the
reward metrics in each point's `extra`, with the margin rising; a preference method on a text-only file
is a 422 naming the field."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.session import dpo_spec, session_dpo_spec
from tests.harness import TINY_RELATIVE, Deployment, tiny_assets, tiny_spec

DPO_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")


@pytest.fixture(scope="module")
def dep(server: Deployment) -> Deployment:
    """The session's `ftq up` (no tokens)."""
    return server


def upload(dep: Deployment, path: Path) -> dict[str, Any]:
    """POST /files with the file as a raw JSON Lines body; the File once validated."""
    r = dep.http.post(
        "/files",
        params={"filename": path.name},
        content=path.read_bytes(),
        headers={"Content-Type": "application/jsonl"},
    )
    assert r.status_code == 201, r.text
    deadline = time.monotonic() + 60
    f: dict[str, Any] = dep.get(f"/files/{r.json()['id']}")
    while f["status"] == "validating":
        assert time.monotonic() < deadline, f
        time.sleep(0.2)
        f = dep.get(f"/files/{f['id']}")
    return f


@dataclass(frozen=True)
class DpoJobs:
    local: str  # 10 steps on the local preference files (the session's `dpo_job`)
    upload: str  # 3 steps on the same rows uploaded through POST /files
    prefs: dict[str, Any]  # that upload, validated


@pytest.fixture(scope="module")
def dpo_jobs(dep: Deployment, dpo_job: str) -> DpoJobs:
    """The module's two DPO jobs, posted together so that they train side by side."""
    prefs = upload(dep, tiny_assets() / "preference" / "train.jsonl")
    on_upload = dpo_spec("preference/train.jsonl", max_steps=3)
    on_upload["dataset"] = {"file_id": prefs["id"]}
    return DpoJobs(local=dpo_job, upload=dep.post_job(on_upload)["id"], prefs=prefs)


@pytest.mark.slow
def test_a_dpo_job_trains_and_its_reward_metrics_reach_the_api(dep: Deployment, dpo_jobs: DpoJobs) -> None:
    plan = dep.dry_run(session_dpo_spec())
    assert plan["trainer"] == "trl.DPOTrainer" and plan["warnings"] == []

    job_id = dpo_jobs.local
    job = dep.wait_terminal(job_id, timeout=600)
    assert job["status"] == "succeeded", dep.report(job_id)

    page = dep.get(f"/jobs/{job_id}/metrics", limit=1000)
    train = [p for p in page["data"] if p["loss"] is not None]
    assert [p["step"] for p in train] == list(range(1, 11))
    for point in train:
        assert all(isinstance(point["extra"][name], float) for name in DPO_METRICS), point
    margins = [p["extra"]["rewards/margins"] for p in train]
    assert sum(margins[-3:]) / 3 > sum(margins[:3]) / 3 + 0.1, margins
    # Paged polls carry the same extra (the dashboard asks after a step).
    later = dep.get(f"/jobs/{job_id}/metrics", after_step=8)
    assert [p["step"] for p in later["data"]] == [9, 10] and later["data"][0]["extra"] == train[8]["extra"]
    assert "reference model: the base model with the LoRA adapter disabled" in dep.train_log(job_id)


def test_a_preference_method_on_a_text_only_file_is_a_422_naming_the_field(dep: Deployment) -> None:
    spec = dpo_spec("data/train.jsonl")
    r = dep.http.post("/jobs", json=spec)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "training", "method"], err
    assert "chosen, rejected" in err["msg"] and "fields found: text" in err["msg"], err

    spec["dataset"]["format"] = "preference"
    r = dep.http.post("/jobs", json=spec)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "dataset", "format"], r.text

    spec["dataset"]["format"] = "text"  # a format the method does not take: the spec says so itself
    r = dep.http.post("/jobs", json=spec)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "dataset", "format"]
    msg = r.json()["detail"][0]["msg"]
    assert "training.method dpo trains on preference or openai_preference data, not text" in msg

    other = dpo_spec("preference/train.jsonl", kto={"beta": 0.2})
    r = dep.http.post("/jobs", json=other)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "training", "kto"], r.text


def test_loss_on_assistant_with_a_tokenizer_without_a_chat_template_is_a_422(dep: Deployment) -> None:
    spec = tiny_spec(TINY_RELATIVE, name="chat", loss_on="assistant")
    spec["dataset"] = {"name_or_path": f"{TINY_RELATIVE}/chat/train.jsonl"}
    assert dep.dry_run(spec)["warnings"] == []  # the tiny template marks assistant turns

    model = dep.data_dir / "no-template"
    shutil.copytree(tiny_assets() / "model", model)
    (model / "chat_template.jinja").unlink()
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    spec["model"]["name_or_path"] = str(model)
    r = dep.http.post("/jobs", json=spec)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "training", "loss_on"], err
    assert "no chat template" in err["msg"] and "{% generation %}" in err["msg"], err


@pytest.mark.slow
def test_a_dpo_job_on_an_uploaded_preference_file(dep: Deployment, dpo_jobs: DpoJobs) -> None:
    prefs = dpo_jobs.prefs
    assert prefs["status"] == "ready" and prefs["formats"] == ["preference"], prefs
    job_id = dpo_jobs.upload
    job = dep.wait_terminal(job_id, timeout=600)
    assert job["status"] == "succeeded", dep.report(job_id)
    train = [p for p in dep.get(f"/jobs/{job_id}/metrics")["data"] if p["loss"] is not None]
    assert len(train) == 3 and all("rewards/margins" in p["extra"] for p in train), train

    text = upload(dep, tiny_assets() / "data" / "train.jsonl")
    spec = dpo_spec("preference/train.jsonl", max_steps=3)
    spec["dataset"] = {"file_id": text["id"]}
    r = dep.http.post("/jobs", json=spec)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "training", "method"] and "chosen, rejected" in err["msg"], err
