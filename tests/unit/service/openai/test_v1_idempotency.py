"""An Idempotency-Key replay of POST /v1/fine_tuning/jobs (issue 48): the first job, answered before the
rate limit, the training file's checks, the "auto" resolve and the active-jobs cap; the same key with
another request is refused without resolving it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import update

from ftq.store.db import session_scope
from ftq.store.models import UploadedFile
from tests.harness.inprocess import MakeClient

ALICE = {"Authorization": "Bearer tok-alice"}


def _upload(client: Any, tiny_dir: Path) -> str:
    from worker.files import validate

    lines = (tiny_dir / "chat" / "train.jsonl").read_bytes().splitlines()[:40]
    r = client.post(
        "/v1/files",
        headers=ALICE,
        files={"file": ("train.jsonl", b"\n".join(lines) + b"\n", "application/jsonl")},
        data={"purpose": "fine-tune"},
    )
    assert r.status_code == 200, r.text
    v1_id = str(r.json()["id"])
    validate("file_" + v1_id.removeprefix("file-"))
    return v1_id


def test_a_v1_replay_gets_its_job_before_the_rate_limit_the_files_checks_and_the_cap(
    make_client: MakeClient, tiny_dir: Path
) -> None:
    client = make_client(
        api_tokens="tok-alice:alice",
        openai_file_wait_seconds="0",
        max_active_jobs_per_owner="1",
        post_rate_per_minute="1",
    )
    train = _upload(client, tiny_dir)
    body = {"model": "ftq-tiny", "training_file": train, "suffix": "a"}
    key = {**ALICE, "Idempotency-Key": "v1-lost-response"}
    first = client.post("/v1/fine_tuning/jobs", json=body, headers=key)
    assert first.status_code == 200, first.text
    job_id = first.json()["id"]

    # Past the rate, at the cap, and with the file no longer ready (resolving again would refuse it).
    with session_scope() as session:
        native = "file_" + train.removeprefix("file-")
        session.execute(update(UploadedFile).where(UploadedFile.id == native).values(status="invalid"))
    again = client.post("/v1/fine_tuning/jobs", json=body, headers=key)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == job_id and again.json()["status"] == "queued"
    assert again.headers["Idempotent-Replayed"] == "true"

    other = client.post("/v1/fine_tuning/jobs", json={**body, "suffix": "b"}, headers=key)
    assert other.status_code == 400, other.text
    assert other.json()["error"]["code"] == "idempotency_mismatch"
    # The same key on the native route is another request (a different body there).
    native_r = client.post("/jobs", json={"model": {"name_or_path": "x/y"}}, headers=key)
    assert native_r.status_code == 422 and native_r.json()["detail"][0]["type"] == "idempotency_mismatch"

    fresh = client.post("/v1/fine_tuning/jobs", json=body, headers={**ALICE, "Idempotency-Key": "other"})
    assert fresh.status_code == 429, fresh.text
