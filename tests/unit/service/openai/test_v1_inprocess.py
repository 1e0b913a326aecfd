"""The OpenAI-compatible API in process: the real `openai` SDK drives the app through the TestClient
(an httpx.Client), for everything that needs no training: files and uploads, the error envelope and its
`param` for bad input, owners apart, lists walked by the SDK's auto-pagination, a job created, listed
and cancelled. Files are validated by calling the worker's validation task's function."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.harness.inprocess import MakeClient

TOKENS = "tok-alice:alice,tok-bob:bob"


def _body(err: openai.APIStatusError) -> dict[str, Any]:
    """The error object of an OpenAI-shaped error answer (the SDK's `body` is its `error`)."""
    assert isinstance(err.body, dict), err.body
    return err.body


def _native_job(client: Any, v1_id: str) -> dict[str, Any]:
    """GET /jobs/{id} of the job `ftjob-<hex>` is, as Alice."""
    r = client.get(f"/jobs/job_{v1_id.removeprefix('ftjob-')}", headers={"Authorization": "Bearer tok-alice"})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _sdk(client: Any, token: str = "tok-alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{client.base_url}/v1", api_key=token, http_client=client, max_retries=0)


def _validate(v1_id: str) -> None:
    from worker.files import validate

    validate("file_" + v1_id.removeprefix("file-"))


def _chat_lines(tiny_dir: Path, n: int) -> bytes:
    lines = (tiny_dir / "chat" / "train.jsonl").read_bytes().splitlines()[:n]
    return b"\n".join(lines) + b"\n"


def _upload(sdk: openai.OpenAI, content: bytes, name: str = "train.jsonl") -> str:
    f = sdk.files.create(file=(name, io.BytesIO(content)), purpose="fine-tune")
    _validate(f.id)
    return f.id


@pytest.fixture
def v1(make_client: MakeClient) -> Any:
    return make_client(api_tokens=TOKENS, openai_file_wait_seconds="0", wandb_mode="offline")


def test_files_the_sdk_uploads_lists_reads_and_deletes(v1: Any, tiny_dir: Path) -> None:
    sdk = _sdk(v1)
    content = _chat_lines(tiny_dir, 5)
    created = sdk.files.create(file=("train.jsonl", io.BytesIO(content)), purpose="fine-tune")
    assert created.id.startswith("file-") and created.object == "file"
    assert (created.status, created.bytes, created.filename) == ("uploaded", len(content), "train.jsonl")
    _validate(created.id)
    assert sdk.files.retrieve(created.id).status == "processed"
    assert sdk.files.content(created.id).content == content
    # The same file on the native API.
    native = v1.get(
        f"/files/file_{created.id.removeprefix('file-')}", headers={"Authorization": "Bearer tok-alice"}
    )
    assert native.status_code == 200 and native.json()["status"] == "ready"

    more = [_upload(sdk, content, f"f{i}.jsonl") for i in range(3)]
    walked = [f.id for f in sdk.files.list(limit=2)]
    assert walked == [*reversed(more), created.id]  # newest first, every page, no repeats
    assert [f.id for f in sdk.files.list(purpose="batch")] == []

    assert sdk.files.delete(more[0]).deleted is True
    with pytest.raises(openai.NotFoundError) as gone:
        sdk.files.retrieve(more[0])
    assert _body(gone.value)["param"] == "file_id"

    with pytest.raises(openai.BadRequestError) as purpose:
        sdk.files.create(file=("x.jsonl", io.BytesIO(content)), purpose="assistants")
    assert _body(purpose.value)["param"] == "purpose"


def test_a_malformed_line_is_named_and_the_file_refused_with_its_param(v1: Any, tiny_dir: Path) -> None:
    sdk = _sdk(v1)
    bad = _upload(sdk, _chat_lines(tiny_dir, 3) + b"{not json\n")
    got = sdk.files.retrieve(bad)
    assert got.status == "error" and got.status_details and "line 4" in got.status_details
    with pytest.raises(openai.BadRequestError) as err:
        sdk.fine_tuning.jobs.create(model="ftq-tiny", training_file=bad)
    assert _body(err.value)["param"] == "training_file" and "line 4" in _body(err.value)["message"]


def test_uploads_join_parts_into_one_file(v1: Any, tiny_dir: Path, make_client: MakeClient) -> None:
    sdk = _sdk(v1)
    content = _chat_lines(tiny_dir, 6)
    half = len(content) // 2
    up = sdk.uploads.create(
        bytes=len(content), filename="big.jsonl", mime_type="application/jsonl", purpose="fine-tune"
    )
    assert up.status == "pending" and up.id.startswith("upload_")
    parts = [sdk.uploads.parts.create(up.id, data=chunk).id for chunk in (content[:half], content[half:])]
    done = sdk.uploads.complete(up.id, part_ids=parts)
    assert done.status == "completed" and done.file is not None
    assert sdk.files.content(done.file.id).content == content

    short = sdk.uploads.create(
        bytes=10, filename="s.jsonl", mime_type="application/jsonl", purpose="fine-tune"
    )
    with pytest.raises(openai.APIStatusError):  # more than the upload was created for
        sdk.uploads.parts.create(short.id, data=content)
    assert sdk.uploads.cancel(short.id).status == "cancelled"
    v1_small = make_client(api_tokens=TOKENS, file_quota_bytes="10000")

    # Unfinished uploads count in the owner's quota: a second one past what is left is refused.
    quota_client = _sdk(v1_small)
    first = quota_client.uploads.create(
        bytes=6000, filename="a.jsonl", mime_type="application/jsonl", purpose="fine-tune"
    )
    quota_client.uploads.parts.create(first.id, data=b"x" * 6000)
    with pytest.raises(openai.RateLimitError):
        quota_client.uploads.create(
            bytes=6000, filename="b.jsonl", mime_type="application/jsonl", purpose="fine-tune"
        )
    quota_client.uploads.cancel(first.id)  # its parts are gone: the room is back
    quota_client.uploads.create(
        bytes=6000, filename="b.jsonl", mime_type="application/jsonl", purpose="fine-tune"
    )


def test_bad_job_requests_get_openai_errors_naming_the_param(v1: Any, tiny_dir: Path) -> None:
    sdk = _sdk(v1)
    train = _upload(sdk, _chat_lines(tiny_dir, 8))
    cases: list[tuple[dict[str, Any], type[openai.APIStatusError], str | None]] = [
        ({"model": "gpt-4o-mini-2024-07-18"}, openai.BadRequestError, "model"),
        ({"hyperparameters": {"n_epochs": -1}}, openai.BadRequestError, "hyperparameters.n_epochs"),
        ({"hyperparameters": {"n_epochs": "three"}}, openai.BadRequestError, "hyperparameters.n_epochs"),
        (
            {"method": {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 0}}}},
            openai.BadRequestError,
            "method.supervised.hyperparameters.batch_size",
        ),
        (
            {"method": {"type": "reinforcement", "reinforcement": {}}},
            openai.BadRequestError,
            "method.reinforcement.grader",
        ),
        ({"training_file": "file-" + "0" * 24}, openai.NotFoundError, "training_file"),
        ({"validation_file": "file-nope"}, openai.NotFoundError, "validation_file"),
        ({"suffix": "has space"}, openai.BadRequestError, "suffix"),
    ]
    for change, error, param in cases:
        body = {"model": "ftq-tiny", "training_file": train, **change}
        with pytest.raises(error) as got:
            sdk.fine_tuning.jobs.create(**body)
        assert _body(got.value)["param"] == param, (change, got.value.body)
        assert set(_body(got.value)) == {"message", "type", "param", "code"}

    # FastAPI's own validation (a missing field) and an unknown path, in the same envelope.
    raw = v1.post(
        "/v1/fine_tuning/jobs", json={"model": "ftq-tiny"}, headers={"Authorization": "Bearer tok-alice"}
    )
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "training_file"
    raw = v1.get("/v1/nothing/here", headers={"Authorization": "Bearer tok-alice"})
    assert raw.status_code == 404 and raw.json()["error"]["type"] == "invalid_request_error"
    # A body over FTQ_MAX_BODY_BYTES, refused by middleware before any route: the same envelope.
    big = v1.post(
        "/v1/fine_tuning/jobs",
        content=b'{"model": "' + b"x" * 2_000_000 + b'"}',
        headers={"Authorization": "Bearer tok-alice", "Content-Type": "application/json"},
    )
    assert big.status_code == 413 and big.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.AuthenticationError) as auth:
        _sdk(v1, "wrong").models.list()
    assert _body(auth.value)["code"] == "invalid_api_key"


def test_a_job_is_created_resolved_listed_and_cancelled_and_owners_are_apart(v1: Any, tiny_dir: Path) -> None:
    alice, bob = _sdk(v1), _sdk(v1, "tok-bob")
    train = _upload(alice, _chat_lines(tiny_dir, 40))
    assert "ftq-tiny" in [m.id for m in alice.models.list()]

    jobs = [
        alice.fine_tuning.jobs.create(
            model="ftq-tiny",
            training_file=train,
            suffix=f"s{i}",
            seed=7,
            metadata={"team": "a" if i else "b"},
        )
        for i in range(3)
    ]
    job = jobs[-1]
    assert job.id.startswith("ftjob-") and job.status == "queued" and job.seed == 7
    # "auto" resolved from the 40 examples: 3 epochs (40 x 3 >= 100), batch 1 per rank on 2 ranks.
    assert job.hyperparameters.n_epochs == 3 and job.hyperparameters.batch_size == 2
    assert job.hyperparameters.learning_rate_multiplier == 1.0
    assert job.method is not None and job.method.type == "supervised"
    assert job.estimated_finish is not None and job.estimated_finish >= job.created_at
    # An ordinary job underneath: on /jobs, with the template's spec and the resolved hyperparameters.
    native = v1.get(
        f"/jobs/job_{job.id.removeprefix('ftjob-')}", headers={"Authorization": "Bearer tok-alice"}
    ).json()
    assert native["spec"]["training"]["num_train_epochs"] == 3
    assert native["spec"]["training"]["per_device_train_batch_size"] == 1
    assert native["spec"]["dataset"]["file_id"] == "file_" + train.removeprefix("file-")

    walked = [j.id for j in alice.fine_tuning.jobs.list(limit=1)]
    assert walked == [j.id for j in reversed(jobs)]
    assert [j.id for j in alice.fine_tuning.jobs.list(metadata={"team": "a"})] == [jobs[2].id, jobs[1].id]

    # Bob sees none of it: 404 for Alice's job and file, nothing listed.
    with pytest.raises(openai.NotFoundError):
        bob.fine_tuning.jobs.retrieve(job.id)
    with pytest.raises(openai.NotFoundError) as foreign:
        bob.fine_tuning.jobs.create(model="ftq-tiny", training_file=train)
    assert _body(foreign.value)["param"] == "training_file"
    assert list(bob.fine_tuning.jobs.list()) == []
    for change in (bob.fine_tuning.jobs.pause, bob.fine_tuning.jobs.resume):
        with pytest.raises(openai.NotFoundError):
            change(job.id)

    # W&B as OpenAI's integrations write it: the spec's integrations.wandb.
    tracked = alice.fine_tuning.jobs.create(
        model="ftq-tiny",
        training_file=train,
        integrations=[{"type": "wandb", "wandb": {"project": "ft-project", "tags": ["a"]}}],
    )
    assert tracked.integrations and tracked.integrations[0].wandb.project == "ft-project"
    wandb = _native_job(v1, tracked.id)["spec"]["integrations"]["wandb"]
    assert wandb == {"project": "ft-project", "entity": None, "tags": ["a"]}
    alice.fine_tuning.jobs.cancel(tracked.id)
    # A model that is no alias but a path a spec accepts trains on the catalog's default template.
    by_path = alice.fine_tuning.jobs.create(model="./tiny/model", training_file=train)
    assert by_path.model == "./tiny/model" and by_path.status == "queued"
    alice.fine_tuning.jobs.cancel(by_path.id)

    cancelled = alice.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "cancelled"
    assert alice.fine_tuning.jobs.retrieve(job.id).status == "cancelled"
    events = list(alice.fine_tuning.jobs.list_events(job.id, limit=1))
    assert [e.type for e in events] == ["message"] * len(events) and len({e.id for e in events}) == len(
        events
    )
    assert events[-1].message == "Created fine-tuning job" and events[0].message == "The job was cancelled"
    assert list(alice.fine_tuning.jobs.checkpoints.list(job.id)) == []
    assert json.loads(cancelled.model_dump_json())["metadata"] == {"team": "a"}


def test_a_job_created_right_after_the_upload_waits_for_the_validation(
    make_client: MakeClient, tiny_dir: Path
) -> None:
    import threading

    client = make_client(api_tokens=TOKENS, openai_file_wait_seconds="60")
    sdk = _sdk(client)
    train = sdk.files.create(file=("t.jsonl", io.BytesIO(_chat_lines(tiny_dir, 8))), purpose="fine-tune")
    assert train.status == "uploaded"
    # The worker's validation lands a second later, while the create waits for it.
    later = threading.Timer(1.0, _validate, args=(train.id,))
    later.start()
    try:
        job = sdk.fine_tuning.jobs.create(model="ftq-tiny", training_file=train.id)
    finally:
        later.join()
    assert job.status == "queued" and sdk.files.retrieve(train.id).status == "processed"


def _succeed(v1_id: str, tiny_dir: Path) -> Path:
    """Record the job `ftjob-<hex>` succeeded, as the controller does, with a final/ folder (the tiny
    model: what a job's model is checked for when it is created); returns the folder."""
    import shutil

    from ftq.contract import runs
    from ftq.contract.status import JobStatus
    from ftq.runtime.settings import get_settings
    from ftq.store import repository
    from ftq.store.db import session_scope

    native = "job_" + v1_id.removeprefix("ftjob-")
    with session_scope() as s:
        assert repository.JOBS.mark_starting(s, native, resources=None)
        assert repository.JOBS.mark_running(s, native, external_id=None, pid=None, pid_start_ticks=None)
        assert repository.JOBS.mark_finished(s, native, JobStatus.succeeded, exit_code=0)
    final = runs.run_dir(get_settings().runs_dir, native) / runs.FINAL
    final.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(tiny_dir / "model", final)
    return final.resolve()


def test_a_fine_tuned_model_goes_on_training_from_its_final_folder(
    make_client: MakeClient, tiny_dir: Path, tmp_path: Path
) -> None:
    """`model="ft:..."` of one of this owner's succeeded jobs: its LoRA adapter trained further on the
    same base (model.adapter), or its full weights (model.name_or_path); another owner's is a 404."""
    catalog = tmp_path / "models.yaml"
    catalog.write_text(
        json.dumps(
            {
                "default": "tiny-lora",
                "models": {
                    "tiny-lora": {
                        "model": {"name_or_path": "./tiny/model"},
                        "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
                        "resources": {"device": "cpu", "processes_per_node": 1},
                        "training": {"learning_rate": 1.0e-3, "max_seq_len": 128},
                    },
                    "tiny-full": {
                        "model": {"name_or_path": "./tiny/model"},
                        "resources": {"device": "cpu", "processes_per_node": 1},
                        "training": {"learning_rate": 1.0e-4, "max_seq_len": 128},
                    },
                },
            }
        )
    )
    client = make_client(api_tokens=TOKENS, openai_file_wait_seconds="0", openai_models=str(catalog))
    alice, bob = _sdk(client), _sdk(client, "tok-bob")
    train = _upload(alice, _chat_lines(tiny_dir, 8))
    lora = alice.fine_tuning.jobs.create(
        model="tiny-lora",
        training_file=train,
        suffix="a",
        hyperparameters={"learning_rate_multiplier": 2, "n_epochs": 1},
    )
    full = alice.fine_tuning.jobs.create(model="tiny-full", training_file=train)
    lora_final, full_final = _succeed(lora.id, tiny_dir), _succeed(full.id, tiny_dir)
    lora_name = alice.fine_tuning.jobs.retrieve(lora.id).fine_tuned_model
    full_name = alice.fine_tuning.jobs.retrieve(full.id).fine_tuned_model
    assert lora_name and full_name and {lora_name, full_name} <= {m.id for m in alice.models.list()}

    more = alice.fine_tuning.jobs.create(model=lora_name, training_file=train, suffix="more")
    assert more.model == lora_name and more.status == "queued"
    spec = _native_job(client, more.id)["spec"]
    source = _native_job(client, lora.id)["spec"]
    assert spec["model"]["adapter"] == str(lora_final)
    assert spec["model"]["name_or_path"] == source["model"]["name_or_path"]
    assert spec["lora"] == source["lora"]
    # The request's multiplier (1 here) scales the source's base rate, not the rate it trained at.
    assert source["training"]["learning_rate"] == 2.0e-3 and spec["training"]["learning_rate"] == 1.0e-3
    assert spec["training"]["loss_on"] == "assistant"

    again = alice.fine_tuning.jobs.create(model=full_name, training_file=train)
    spec = _native_job(client, again.id)["spec"]
    assert spec["model"]["name_or_path"] == str(full_final) and spec.get("lora") is None
    assert spec["model"].get("adapter") is None

    # Another owner's fine-tuned model, and names of none: a 404 naming `model`.
    bob_train = _upload(bob, _chat_lines(tiny_dir, 8))
    for name in (lora_name, lora_name.replace(":a:", ":b:"), "ft:tiny-lora:alice::" + "0" * 16, "ft:x"):
        with pytest.raises(openai.NotFoundError) as got:
            (alice if name != lora_name else bob).fine_tuning.jobs.create(
                model=name, training_file=train if name != lora_name else bob_train
            )
        assert _body(got.value)["param"] == "model", name
    # A job that has not succeeded names no model either.
    queued = alice.fine_tuning.jobs.create(model="tiny-lora", training_file=train)
    with pytest.raises(openai.NotFoundError):
        alice.fine_tuning.jobs.create(
            model=f"ft:tiny-lora:alice::{queued.id.removeprefix('ftjob-')}", training_file=train
        )
    # The native spec's model.adapter is checked as model.name_or_path is: another owner's run is refused.
    foreign = {
        "model": {"name_or_path": "./tiny/model", "adapter": str(lora_final)},
        "lora": {"r": 4},
        "dataset": {"file_id": "file_" + bob_train.removeprefix("file-")},
        "resources": {"device": "cpu", "processes_per_node": 1},
        "training": {"max_steps": 1},
    }
    refused = client.post("/jobs", json=foreign, headers={"Authorization": "Bearer tok-bob"})
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["body", "model", "adapter"]
    assert refused.json()["detail"][0]["type"] == "path_refused"


RL_GRADER = {
    "type": "string_check",
    "name": "exact",
    "input": "{{sample.output_text}}",
    "reference": "{{item.answer}}",
    "operation": "eq",
}


def _reinforcement_lines(n: int) -> bytes:
    """OpenAI's reinforcement rows: a conversation up to the model's turn, and the grader's reference."""
    rows = [
        {"messages": [{"role": "user", "content": f"{i} + 1 = ?"}], "answer": str(i + 1)} for i in range(n)
    ]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def test_a_reinforcement_job_maps_onto_grpo_with_its_grader(v1: Any) -> None:
    sdk = _sdk(v1)
    train = _upload(sdk, _reinforcement_lines(12))
    job = sdk.fine_tuning.jobs.create(
        model="ftq-tiny",
        training_file=train,
        method={  # type: ignore[arg-type]
            "type": "reinforcement",
            "reinforcement": {
                "grader": RL_GRADER,
                "hyperparameters": {"batch_size": 1, "compute_multiplier": 0.5, "n_epochs": 2},
            },
        },
    )
    assert job.status == "queued" and job.method is not None and job.method.type == "reinforcement"
    assert job.method.reinforcement is not None
    assert job.method.reinforcement.grader.type == "string_check"
    hyper = job.method.reinforcement.hyperparameters
    assert hyper is not None and hyper.compute_multiplier == 0.5 and hyper.eval_samples == 4
    # 1 prompt a step, 8 x 0.5 = 4 completions of it, over the template's 2 ranks: 2 a rank.
    training = _native_job(v1, job.id)["spec"]["training"]
    assert training["method"] == "grpo" and training["grpo"]["num_generations"] == 4
    assert training["per_device_train_batch_size"] == 2 and training["num_train_epochs"] == 2
    assert training["grader"]["reference"] == "{{item.answer}}"
    raw = v1.get(f"/v1/fine_tuning/jobs/{job.id}", headers={"Authorization": "Bearer tok-alice"}).json()
    from openai.types.fine_tuning import FineTuningJob

    FineTuningJob.model_validate(raw)  # the raw JSON in the SDK's own model
    sdk.fine_tuning.jobs.cancel(job.id)

    hyper_param = "method.reinforcement.hyperparameters."
    cases: list[tuple[dict[str, Any], str]] = [
        ({"hyperparameters": {"eval_samples": 4}}, hyper_param + "eval_samples"),
        ({"hyperparameters": {"reasoning_effort": "high"}}, hyper_param + "reasoning_effort"),
        ({"hyperparameters": {"eval_interval": 5}}, hyper_param + "eval_interval"),  # no validation file
        ({"hyperparameters": {"compute_multiplier": 0}}, hyper_param + "compute_multiplier"),
        ({"grader": {**RL_GRADER, "operation": "contains"}}, "method.reinforcement.grader.operation"),
        ({"grader": {"type": "python", "source": "x = 1"}}, "method.reinforcement.grader.source"),
    ]
    for change, param in cases:
        method = {"type": "reinforcement", "reinforcement": {"grader": RL_GRADER, **change}}
        with pytest.raises(openai.BadRequestError) as got:
            sdk.fine_tuning.jobs.create(model="ftq-tiny", training_file=train, method=method)  # type: ignore[arg-type]
        assert _body(got.value)["param"] == param, (change, got.value.body)
