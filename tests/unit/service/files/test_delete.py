"""Deleting an upload that a job still needs (issue 48): a 409 naming the job whichever field of the spec
names it (dataset.file_id, dataset.eval_file_id, eval.suites[i].file_id), through `/files` and `/v1/files`
alike, while the job has not ended or an evaluation of it is queued or running."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import update

from ftq.contract import runs
from ftq.runtime.settings import get_settings
from ftq.store.db import session_scope
from ftq.store.files_repository import file_ids_of
from ftq.store.models import Job
from tests.harness.inprocess import MakeClient


def _upload(client: Any, data: bytes) -> str:
    from worker.files import validate

    headers = {"Content-Type": "application/jsonl"}
    r = client.post("/files", params={"filename": "held.jsonl"}, content=data, headers=headers)
    assert r.status_code == 201, r.text
    file_id = str(r.json()["id"])
    validate(file_id)
    assert client.get(f"/files/{file_id}").json()["status"] == "ready"
    return file_id


def test_a_file_an_eval_suite_names_cannot_be_deleted_while_the_job_or_its_evaluation_needs_it(
    make_client: MakeClient, store_url: str, tiny_job: dict[str, Any], tiny_dir: Path
) -> None:
    client = make_client(store_url)
    held = _upload(client, (tiny_dir / "data" / "train.jsonl").read_bytes())
    spec = {**tiny_job, "eval": {"suites": [{"name": "held", "type": "loss", "file_id": held}]}}
    r = client.post("/jobs", json=spec)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]

    busy = client.delete(f"/files/{held}")
    assert busy.status_code == 409 and job_id in busy.json()["detail"], busy.text
    v1 = client.delete(f"/v1/files/file-{held.removeprefix('file_')}")
    assert v1.status_code == 409, v1.text
    assert job_id in v1.json()["error"]["message"]

    # Paused: not ended, its next run reads the file.
    assert client.post(f"/jobs/{job_id}/pause").json()["status"] == "paused"
    assert client.delete(f"/files/{held}").status_code == 409

    # Ended, with an evaluation of its final/ queued: the suite still reads the file.
    with session_scope() as session:
        session.execute(update(Job).where(Job.id == job_id).values(status="succeeded"))
    (runs.run_dir(get_settings().runs_dir, job_id) / runs.FINAL).mkdir(parents=True)
    ev = client.post(f"/jobs/{job_id}/evaluations", json={"checkpoint": "final"})
    assert ev.status_code == 202, ev.text
    busy = client.delete(f"/files/{held}")
    assert busy.status_code == 409 and job_id in busy.json()["detail"], busy.text

    # Once nothing needs it, it goes.
    cancel = client.post(f"/jobs/{job_id}/evaluations/{ev.json()['id']}/cancel")
    assert cancel.status_code == 202 and cancel.json()["status"] == "cancelled", cancel.text
    assert client.delete(f"/files/{held}").status_code == 204
    assert client.get(f"/files/{held}").status_code == 404


def test_every_file_id_field_of_a_spec_is_found_at_any_depth() -> None:
    spec = {
        "dataset": {"file_id": "file_a", "eval_file_id": "file_b", "name_or_path": "file_x"},
        "eval": {"suites": [{"name": "q", "file_id": "file_c"}, {"name": "l", "dataset": "./d.jsonl"}]},
        "future": {"deep": [{"reference_file_id": "file_d"}]},
    }
    assert file_ids_of(spec) == {"file_a", "file_b", "file_c", "file_d"}
    assert file_ids_of(None) == set()
