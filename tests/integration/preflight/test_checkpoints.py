"""Checkpoints the trainer really writes: listed, judged resumable, and continued from by a new job."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Deployment, tiny_spec


@pytest.fixture(scope="module")
def first(quick_up: Deployment, tiny_dir: Path) -> dict[str, Any]:
    """A LoRA run of 4 steps saving every 2: checkpoint-2 and checkpoint-4."""
    job = quick_up.post_job(tiny_spec(tiny_dir, max_steps=4, name="first", save_steps=2))
    ended = quick_up.wait_terminal(job["id"])
    assert ended["status"] == "succeeded", quick_up.train_log(job["id"])[-3000:]
    return ended


def checkpoints(stack: Deployment, job_id: str) -> list[dict[str, Any]]:
    r = stack.http.get(f"/jobs/{job_id}/checkpoints")
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def test_real_checkpoints_are_listed_resumable(quick_up: Deployment, first: dict[str, Any]) -> None:
    listed = checkpoints(quick_up, first["id"])
    assert [(c["step"], c["resumable"]) for c in listed] == [(2, True), (4, True)]
    ckpt = Path(listed[-1]["path"])
    assert ckpt == quick_up.run_dir(first["id"]) / "checkpoints" / "checkpoint-4"
    names = {p.name for p in ckpt.iterdir()}
    assert {
        "adapter_model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
        "trainer_state.json",
    } <= names


@pytest.mark.parametrize(
    ("step", "damage"),
    [
        (5, "optimizer.pt"),  # no optimizer state
        (6, "rng_state.pth"),  # no RNG state: resuming would not reproduce the data order
        (7, "truncate:trainer_state.json"),  # cut short by a kill or a full disk
        (8, "empty:adapter_model.safetensors"),
        (9, "scheduler.pt"),
    ],
)
def test_incomplete_checkpoints_are_not_resumable(
    quick_up: Deployment, first: dict[str, Any], step: int, damage: str
) -> None:
    root = quick_up.run_dir(first["id"]) / "checkpoints"
    copy = root / f"checkpoint-{step}"
    shutil.copytree(root / "checkpoint-4", copy)
    kind, _, name = damage.rpartition(":")
    if kind == "truncate":
        text = (copy / name).read_text()
        (copy / name).write_text(text[: len(text) // 2])
    elif kind == "empty":
        (copy / name).write_bytes(b"")
    else:
        (copy / name).unlink()
    found = {c["step"]: c["resumable"] for c in checkpoints(quick_up, first["id"])}
    assert found[4] is True and found[step] is False


def test_resume_from_skips_incomplete_checkpoints_and_names_what_exists(
    quick_up: Deployment, first: dict[str, Any], tiny_dir: Path
) -> None:
    # checkpoint-5.. are the damaged copies above (or absent when run alone): `latest` is still 4.
    spec = tiny_spec(tiny_dir, max_steps=6, name="second")
    plan = quick_up.dry_run({**spec, "resume_from": {"job_id": first["id"], "checkpoint": "latest"}})
    resume = plan["trainer_args"]["resume_from_checkpoint"]
    assert resume == str(quick_up.run_dir(first["id"]) / "checkpoints" / "checkpoint-4")
    assert "--resume_from_checkpoint" in plan["command"] and resume in plan["command"]
    r = quick_up.http.post("/jobs", json={**spec, "resume_from": {"job_id": first["id"], "checkpoint": 3}})
    assert r.status_code == 422
    err = r.json()["detail"][0]
    assert err["loc"] == ["body", "resume_from", "checkpoint"] and "have 2, 4" in err["msg"]
    r = quick_up.http.post(
        "/jobs", json={**spec, "resume_from": {"job_id": "job_doesnotexist00", "checkpoint": "latest"}}
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "resume_from", "job_id"]


@pytest.mark.slow
def test_a_job_resumed_from_a_checkpoint_continues_at_its_step(
    quick_up: Deployment, first: dict[str, Any], tiny_dir: Path
) -> None:
    spec = tiny_spec(tiny_dir, max_steps=6, name="resumed")
    job = quick_up.post_job({**spec, "resume_from": {"job_id": first["id"], "checkpoint": 4}})
    ended = quick_up.wait_terminal(job["id"])
    assert ended["status"] == "succeeded", quick_up.train_log(job["id"])[-3000:]
    points = quick_up.http.get(f"/jobs/{job['id']}/metrics").json()["data"]
    steps = [p["step"] for p in points if p["loss"] is not None]
    # It trained steps 5 and 6 only: the first four came from the checkpoint.
    assert steps and steps[0] == 5 and steps[-1] == 6, points
    first_line = json.loads((quick_up.run_dir(job["id"]) / "metrics.jsonl").read_text().splitlines()[0])
    assert first_line["step"] == 5
    assert ended["progress"]["step"] == 6


@pytest.mark.slow
def test_fsdp2_sharded_checkpoints_are_resumable(quick_up: Deployment, tiny_dir: Path) -> None:
    """Two processes under FSDP2 on the CPU: sharded model and optimizer folders (torch DCP)."""
    spec = tiny_spec(tiny_dir, max_steps=2, name="fsdp", save_steps=2)
    spec["lora"] = None
    spec["distributed"] = {"strategy": "fsdp", "fsdp": {"version": 2, "state_dict_type": "sharded"}}
    spec["resources"]["processes_per_node"] = 2
    job = quick_up.post_job(spec)
    ended = quick_up.wait_terminal(job["id"], timeout=400)
    assert ended["status"] == "succeeded", quick_up.train_log(job["id"])[-3000:]
    listed = checkpoints(quick_up, job["id"])
    assert [(c["step"], c["resumable"]) for c in listed] == [(2, True)]
    ckpt = Path(listed[0]["path"])
    assert (ckpt / "pytorch_model_fsdp_0" / ".metadata").is_file() and (ckpt / "optimizer_0").is_dir()
    assert (ckpt / "rng_state_0.pth").is_file() and (ckpt / "rng_state_1.pth").is_file()
    # A shard set without its .metadata (written last, after every rank's shards) is not resumable.
    broken = ckpt.parent / "checkpoint-3"
    shutil.copytree(ckpt, broken)
    (broken / "optimizer_0" / ".metadata").unlink()
    found = {c["step"]: c["resumable"] for c in checkpoints(quick_up, job["id"])}
    assert found == {2: True, 3: False}
    # Issue 27: checked at submit against this job's strategy and world size. FSDP's sharded state
    # reshards onto another world size (one process here, accumulating two micro-batches a step so that
    # a step keeps its rows); DDP cannot read it: a 422 naming resume_from.
    resume = {"resume_from": {"job_id": job["id"], "checkpoint": 2}}
    one = {**spec, **resume, "resources": {**spec["resources"], "processes_per_node": 1}}
    r = quick_up.http.post("/jobs", params={"dry_run": "true"}, json=one)
    assert r.status_code == 422 and "gradient_accumulation_steps: 2" in r.json()["detail"][0]["msg"], r.text
    one["training"] = {**spec["training"], "gradient_accumulation_steps": 2}
    assert quick_up.dry_run(one)["trainer_args"]["resume_from_checkpoint"] == str(ckpt)
    ddp = {**spec, **resume, "distributed": {"strategy": "ddp"}}
    r = quick_up.http.post("/jobs", params={"dry_run": "true"}, json=ddp)
    assert r.status_code == 422, r.text
    err = r.json()["detail"][0]
    assert err["loc"] == ["body", "resume_from"] and "written under fsdp" in err["msg"]
