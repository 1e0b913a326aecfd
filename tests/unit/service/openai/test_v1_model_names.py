"""`ft:` model names (issue 48): `ft:<base>:<owner>:<suffix>:<hex>` with a catalog alias, a hub id or a
local model's short name as its base, never the server's path of the model (a native job's spec holds
the resolved, absolute path); the name stays what GET /v1/models lists and what a job goes on from."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from ftq.contract import runs
from ftq.contract.status import JobStatus
from ftq.runtime.settings import get_settings
from ftq.store import repository
from ftq.store.db import session_scope
from service.openai.models import base_name, fine_tuned_name
from tests.harness.assets import checkpoint_dir
from tests.harness.inprocess import MakeClient

ALICE = {"Authorization": "Bearer tok-alice"}


@pytest.mark.parametrize(
    ("model", "base"),
    [
        ("ftq-tiny", "ftq-tiny"),
        ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B"),
        ("./tiny/model", "model"),
        ("/srv/ftq/data/models/llama 3:8b/", "llama-3-8b"),
        ("/", "model"),
        ("ft:tiny-lora:alice:a:0123456789abcdef", "tiny-lora"),
        ("ft:ft:/srv/x/tiny/model:alice::01:alice:b:02", "model"),
    ],
)
def test_the_base_of_a_name_is_never_a_path(model: str, base: str) -> None:
    assert base_name(model) == base
    assert fine_tuned_name(model, "alice", None, "ab") == f"ft:{base}:alice::ab"


def _succeed(job_id: str, tiny_dir: Path) -> None:
    with session_scope() as s:
        assert repository.JOBS.mark_starting(s, job_id, resources=None)
        assert repository.JOBS.mark_running(s, job_id, external_id=None, pid=None, pid_start_ticks=None)
        assert repository.JOBS.mark_finished(s, job_id, JobStatus.succeeded, exit_code=0)
    final = runs.run_dir(get_settings().runs_dir, job_id) / runs.FINAL
    final.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(tiny_dir / "model", final)


def _upload(client: Any, tiny_dir: Path) -> str:
    from worker.files import validate

    lines = (tiny_dir / "chat" / "train.jsonl").read_bytes().splitlines()[:8]
    r = client.post(
        "/v1/files",
        headers=ALICE,
        files={"file": ("train.jsonl", b"\n".join(lines) + b"\n", "application/jsonl")},
        data={"purpose": "fine-tune"},
    )
    assert r.status_code == 200, r.text
    validate("file_" + r.json()["id"].removeprefix("file-"))
    return str(r.json()["id"])


def test_a_native_jobs_model_name_shows_no_server_path_and_resolves(
    make_client: MakeClient, tiny_job: dict[str, Any], tiny_dir: Path
) -> None:
    client = make_client(api_tokens="tok-alice:alice", openai_file_wait_seconds="0")
    r = client.post("/jobs", json=tiny_job, headers=ALICE)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    resolved = r.json()["spec"]["model"]["name_or_path"]
    assert resolved.startswith("/")  # what the spec holds: the server's path of ./tiny/model
    _succeed(job_id, tiny_dir)
    hex_ = job_id.removeprefix("job_")

    name = f"ft:model:alice::{hex_}"
    listed = [m["id"] for m in client.get("/v1/models", headers=ALICE).json()["data"]]
    assert name in listed, listed
    assert not [m for m in listed if str(Path(resolved).parent) in m or m.startswith("ft:/")]
    assert client.get(f"/v1/models/{name}", headers=ALICE).json()["id"] == name
    job = client.get(f"/v1/fine_tuning/jobs/ftjob-{hex_}", headers=ALICE).json()
    assert job["fine_tuned_model"] == name
    # A checkpoint's name has the same base.
    checkpoint_dir(runs.run_dir(get_settings().runs_dir, job_id), 2)
    ckpts = client.get(f"/v1/fine_tuning/jobs/ftjob-{hex_}/checkpoints", headers=ALICE).json()["data"]
    assert [c["fine_tuned_model_checkpoint"] for c in ckpts] == [f"{name}:ckpt-step-2"]

    # It resolves: a job goes on from it, and that job's model is named after the first base.
    train = _upload(client, tiny_dir)
    more = client.post(
        "/v1/fine_tuning/jobs", json={"model": name, "training_file": train, "suffix": "more"}, headers=ALICE
    )
    assert more.status_code == 200, more.text
    assert more.json()["model"] == name
    _succeed("job_" + more.json()["id"].removeprefix("ftjob-"), tiny_dir)
    again = client.get(f"/v1/fine_tuning/jobs/{more.json()['id']}", headers=ALICE).json()
    assert again["fine_tuned_model"] == f"ft:model:alice:more:{more.json()['id'].removeprefix('ftjob-')}"
