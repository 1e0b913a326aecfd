"""The jobs API in process on SQLite: validation, storage, pages, owners, idempotency. The tests that take
`store_url` run again on PostgreSQL in tests/integration/store/test_api_on_postgres.py."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.harness.inprocess import MakeClient

BAD_SPECS: list[tuple[Callable[[dict[str, Any]], object], list[str]]] = [
    # (mutation, the field path the 422 must name)
    (lambda s: s.update(surprise=1), ["surprise"]),
    (lambda s: s["training"].update(lr=1), ["training", "lr"]),
    (lambda s: s["training"].update(learning_rate=-1), ["training", "learning_rate"]),
    (lambda s: s["training"].update(num_train_epochs=1), ["training"]),
    (lambda s: s["training"].pop("max_steps"), ["training"]),
    (lambda s: s["resources"].update(num_nodes=2), ["resources", "num_nodes"]),
    (lambda s: s["model"].update(attn_implementation="flash_attention_2"), ["model", "attn_implementation"]),
    (
        lambda s: (
            s["model"].update(attn_implementation="flash_attention_2"),
            s["resources"].update(device="cuda"),
            s["training"].update(mixed_precision="no"),
        ),
        ["model", "attn_implementation"],
    ),
    (
        lambda s: (
            s["training"].update(gradient_checkpointing=True),
            s.update(distributed={"strategy": "fsdp", "fsdp": {"activation_checkpointing": True}}),
            s["resources"].update(processes_per_node=2),
        ),
        ["distributed", "fsdp", "activation_checkpointing"],
    ),
    (lambda s: s["lora"].update(r=0), ["lora", "r"]),
    (lambda s: s.update(distributed={"strategy": "megatron"}), ["distributed", "strategy"]),
    (lambda s: s["training"].update(mixed_precision="fp8"), ["training", "mixed_precision"]),
    (lambda s: s.update(name="has spaces; rm -rf /"), ["name"]),
    (
        lambda s: s["resources"].update(slurm={"partition": "gpu$(touch /tmp/x)"}),
        ["resources", "slurm", "partition"],
    ),
    (lambda s: s["resources"].update(slurm={"time_limit": "forever"}), ["resources", "slurm", "time_limit"]),
    (lambda s: s["model"].update(name_or_path="/etc"), ["model", "name_or_path"]),
    (lambda s: s["dataset"].update(name_or_path="./tiny/data/nope.jsonl"), ["dataset", "name_or_path"]),
    (lambda s: s["lora"].update(target_modules=[]), ["lora", "target_modules"]),
    (lambda s: s["resources"].update(processes_per_node=2), ["distributed", "strategy"]),
    (
        lambda s: s.update(
            distributed={"strategy": "deepspeed", "deepspeed": {"zero_stage": 2, "offload_params": "cpu"}}
        ),
        ["distributed", "deepspeed"],
    ),
    (lambda s: s.pop("model"), ["model"]),
    (lambda s: s["training"].update(max_steps="many"), ["training", "max_steps"]),
    (lambda s: s["training"].update(mixed_precision="fp16"), ["training", "mixed_precision"]),
]


@pytest.mark.parametrize(
    ("mutate", "loc"), BAD_SPECS, ids=[".".join(map(str, loc)) or "root" for _, loc in BAD_SPECS]
)
def test_bad_spec_is_422_naming_the_field(
    make_client: MakeClient,
    tiny_job: dict[str, Any],
    mutate: Callable[[dict[str, Any]], object],
    loc: list[str],
) -> None:
    client = make_client()
    spec = copy.deepcopy(tiny_job)
    mutate(spec)
    r = client.post("/jobs", json=spec)
    assert r.status_code == 422, r.text
    locs = [e["loc"] for e in r.json()["detail"]]
    assert any(got[: len(loc) + 1] == ["body", *loc] for got in locs), locs
    assert all(e["msg"] for e in r.json()["detail"])
    assert client.get("/jobs").json()["data"] == []


def test_malformed_bodies_are_4xx(make_client: MakeClient) -> None:
    client = make_client()
    assert (
        client.post("/jobs", content=b"{not json", headers={"content-type": "application/json"}).status_code
        == 400
    )
    assert (
        client.post("/jobs", content=b"a: [1", headers={"content-type": "application/yaml"}).status_code
        == 400
    )
    assert (
        client.post("/jobs", content=b"[1, 2]", headers={"content-type": "application/json"}).status_code
        == 422
    )
    assert client.post("/jobs", content=b"", headers={"content-type": "application/json"}).status_code == 400
    assert client.post("/jobs", content=b"x", headers={"content-type": "text/html"}).status_code == 415
    big = b"{" + b" " * 2_000_000 + b"}"
    assert client.post("/jobs", content=big, headers={"content-type": "application/json"}).status_code == 413


def test_create_list_get_paginate(make_client: MakeClient, store_url: str, tiny_job: dict[str, Any]) -> None:
    client = make_client(store_url)
    ids = []
    for i in range(5):
        spec = copy.deepcopy(tiny_job)
        spec["name"] = f"job-{i}"
        r = client.post("/jobs", json=spec)
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["status"] == "queued" and job["owner"] == "local" and job["name"] == f"job-{i}"
        assert job["spec"]["model"]["name_or_path"].endswith("examples/tiny/model")
        ids.append(job["id"])
    assert client.get(f"/jobs/{ids[0]}").json()["id"] == ids[0]

    page1 = client.get("/jobs?limit=2").json()
    assert [j["id"] for j in page1["data"]] == [ids[4], ids[3]]
    # A job added between pages must not shift the next page.
    client.post("/jobs", json=tiny_job)
    page2 = client.get(f"/jobs?limit=2&cursor={page1['next_cursor']}").json()
    assert [j["id"] for j in page2["data"]] == [ids[2], ids[1]]
    page3 = client.get(f"/jobs?limit=2&cursor={page2['next_cursor']}").json()
    assert [j["id"] for j in page3["data"]] == [ids[0]]
    assert page3["next_cursor"] is None

    assert len(client.get("/jobs?status=queued&limit=100").json()["data"]) == 6
    assert client.get("/jobs?status=running").json()["data"] == []
    assert client.get("/jobs?status=bogus").status_code == 422
    assert client.get("/jobs?cursor=abc").status_code == 400


def test_unknown_ids_are_404_on_every_route(make_client: MakeClient) -> None:
    client = make_client()
    for path in ["", "/plan", "/logs", "/metrics", "/checkpoints", "/logs/stream"]:
        assert client.get(f"/jobs/job_doesnotexist{path}").status_code == 404, path
    assert client.post("/jobs/job_doesnotexist/cancel").status_code == 404


def test_yaml_body_and_dry_run(make_client: MakeClient, tiny_job: dict[str, Any]) -> None:
    client = make_client()
    r = client.post("/jobs", content=yaml.safe_dump(tiny_job), headers={"content-type": "application/yaml"})
    assert r.status_code == 201, r.text
    r = client.post("/jobs?dry_run=true", json=tiny_job)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert "accelerate_config_yaml" in plan and plan["command"]
    assert "-m" in plan["command"] and "trainer" in plan["command"]
    # Nothing was stored by the dry run.
    assert len(client.get("/jobs").json()["data"]) == 1
    job_id = client.get("/jobs").json()["data"][0]["id"]
    stored = client.get(f"/jobs/{job_id}/plan").json()
    assert job_id in " ".join(stored["command"])


def test_idempotency(make_client: MakeClient, store_url: str, tiny_job: dict[str, Any]) -> None:
    client = make_client(store_url)
    h = {"Idempotency-Key": "abc-123"}
    first = client.post("/jobs", json=tiny_job, headers=h)
    again = client.post("/jobs", json=tiny_job, headers=h)
    assert first.status_code == 201 and again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    assert again.headers.get("Idempotent-Replayed") == "true"
    other = copy.deepcopy(tiny_job)
    other["training"]["max_steps"] = 7
    r = client.post("/jobs", json=other, headers=h)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    assert len(client.get("/jobs").json()["data"]) == 1


def test_concurrent_duplicates_make_one_job(
    make_client: MakeClient, store_url: str, tiny_job: dict[str, Any]
) -> None:
    import asyncio

    import httpx

    client = make_client(store_url)

    # Six requests at once in one event loop, each handler in the app's own thread pool. (Six threads
    # each calling the TestClient, a portal and an event loop per request, once left one request never
    # answered: a hang in the test's transport, not in the app.)
    async def post_all() -> list[int]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            posts = [http.post("/jobs", json=tiny_job, headers={"Idempotency-Key": "race"}) for _ in range(6)]
            return [r.status_code for r in await asyncio.gather(*posts)]

    results = asyncio.run(post_all())
    assert set(results) <= {201, 409}, results
    assert 201 in results
    assert len(client.get("/jobs").json()["data"]) == 1


def test_owners_are_kept_apart(make_client: MakeClient, store_url: str, tiny_job: dict[str, Any]) -> None:
    client = make_client(store_url, api_tokens="tok-a:alice,tok-b:bob")
    alice = {"Authorization": "Bearer tok-a"}
    bob = {"Authorization": "Bearer tok-b"}
    assert client.get("/jobs").status_code == 401
    assert client.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post("/jobs", json=tiny_job).status_code == 401
    job = client.post("/jobs", json=tiny_job, headers=alice).json()
    assert job["owner"] == "alice"
    for path in ["", "/plan", "/logs", "/metrics", "/checkpoints", "/samples"]:
        assert client.get(f"/jobs/{job['id']}{path}", headers=bob).status_code == 404, path
        assert client.get(f"/jobs/{job['id']}{path}", headers=alice).status_code == 200, path
    assert client.post(f"/jobs/{job['id']}/cancel", headers=bob).status_code == 404
    for action in ("pause", "resume"):
        assert client.post(f"/jobs/{job['id']}/{action}", headers=bob).status_code == 404, action
    assert client.get(f"/jobs/{job['id']}", headers=alice).json()["status"] == "queued"
    assert client.get("/jobs", headers=bob).json()["data"] == []
    # Idempotency keys are per owner: bob's same key is a different request.
    a1 = client.post("/jobs", json=tiny_job, headers={**alice, "Idempotency-Key": "k"}).json()
    b1 = client.post("/jobs", json=tiny_job, headers={**bob, "Idempotency-Key": "k"}).json()
    assert a1["id"] != b1["id"] and b1["owner"] == "bob"


def test_cancel_queued_job(make_client: MakeClient, tiny_job: dict[str, Any]) -> None:
    client = make_client()
    job = client.post("/jobs", json=tiny_job).json()
    r = client.post(f"/jobs/{job['id']}/cancel")
    assert r.status_code == 202 and r.json()["status"] == "cancelled"
    assert r.json()["error"] is None
    again = client.post(f"/jobs/{job['id']}/cancel")
    assert again.status_code == 202 and again.json()["status"] == "cancelled"
    assert again.json()["finished_at"] == r.json()["finished_at"]


def test_pause_holds_a_queued_job_resume_queues_it_and_an_ended_job_refuses_both(
    make_client: MakeClient, store_url: str, tiny_job: dict[str, Any]
) -> None:
    client = make_client(store_url)
    job = client.post("/jobs", json=tiny_job).json()
    assert client.post("/jobs/job_doesnotexist/pause").status_code == 404
    # Resuming a job that is not paused changes nothing (idempotent, as cancel is).
    r = client.post(f"/jobs/{job['id']}/resume")
    assert r.status_code == 202 and r.json()["status"] == "queued"
    paused = client.post(f"/jobs/{job['id']}/pause")
    assert paused.status_code == 202, paused.text
    assert paused.json()["status"] == "paused" and paused.json()["progress"]["phase"] == "paused"
    assert paused.json()["finished_at"] is None  # not terminal
    again = client.post(f"/jobs/{job['id']}/pause")
    assert again.status_code == 202 and again.json()["status"] == "paused"
    listed = client.get("/jobs", params={"status": "paused"}).json()["data"]
    assert [j["id"] for j in listed] == [job["id"]]
    resumed = client.post(f"/jobs/{job['id']}/resume")
    assert resumed.status_code == 202 and resumed.json()["status"] == "queued"
    types = [e["type"] for e in client.get(f"/jobs/{job['id']}/events").json()["data"]]
    assert types == ["job.created", "job.queued", "job.paused", "job.resumed", "job.queued"], types
    # A paused job is cancelled at once (nothing runs); an ended job can be neither paused nor resumed.
    client.post(f"/jobs/{job['id']}/pause")
    cancelled = client.post(f"/jobs/{job['id']}/cancel").json()
    assert cancelled["status"] == "cancelled" and cancelled["finished_at"]
    for action, code in (("pause", "not_pausable"), ("resume", "not_resumable")):
        refused = client.post(f"/jobs/{job['id']}/{action}")
        assert refused.status_code == 409, refused.text
        assert refused.json()["code"] == code and "cancelled" in refused.json()["detail"], refused.json()


def test_logs_metrics_checkpoints_read_the_run_dir(
    make_client: MakeClient, store_url: str, ftq_env: dict[str, str], tiny_job: dict[str, Any]
) -> None:
    from pathlib import Path

    from ftq.store import repository
    from ftq.store.db import session_scope

    client = make_client(store_url)
    job = client.post("/jobs", json=tiny_job).json()
    run = Path(ftq_env["FTQ_DATA_DIR"]) / "runs" / job["id"]
    run.mkdir(parents=True)
    text = "".join(f"line {i} ✓ día\n" for i in range(3000))
    (run / "train.log").write_text(text, encoding="utf-8")

    # Reading in 4 KiB chunks adds up to the whole log, with no character split across chunks.
    offset, parts = 0, []
    while True:
        chunk = client.get(f"/jobs/{job['id']}/logs?offset={offset}&limit=4096").json()
        assert chunk["offset"] == offset
        assert chunk["next_offset"] - offset <= 4096
        parts.append(chunk["text"])
        if chunk["next_offset"] == offset:
            break
        offset = chunk["next_offset"]
    assert "".join(parts) == text
    assert chunk["complete"] is False  # the job is not terminal

    with session_scope() as s:
        repository.upsert_points(
            s, job["id"], [{"step": i, "loss": 5 - i / 100, "learning_rate": 1e-3} for i in range(1, 251)]
        )
        repository.upsert_points(s, job["id"], [{"step": 200, "eval_loss": 2.5}])
    page = client.get(f"/jobs/{job['id']}/metrics?after_step=100&limit=50").json()
    assert [p["step"] for p in page["data"]] == list(range(101, 151))
    assert page["next_after_step"] == 150
    p200 = client.get(f"/jobs/{job['id']}/metrics?after_step=199&limit=1").json()["data"][0]
    assert p200["eval_loss"] == 2.5 and p200["loss"] == pytest.approx(3.0)

    ck = run / "checkpoints"
    (ck / "checkpoint-2").mkdir(parents=True)
    for n in ["scheduler.pt", "rng_state.pth", "optimizer.pt", "adapter_model.safetensors"]:
        (ck / "checkpoint-2" / n).write_text("x")
    (ck / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2}')
    (ck / "checkpoint-4").mkdir()
    (ck / "checkpoint-4" / "adapter_model.safetensors").write_text("x")
    data = client.get(f"/jobs/{job['id']}/checkpoints").json()["data"]
    assert [(c["step"], c["resumable"]) for c in data] == [(2, True), (4, False)]


def test_health_and_readiness(make_client: MakeClient) -> None:
    client = make_client()
    assert client.get("/healthz").json()["status"] == "ok"
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["checks"] == {"store": "ok", "broker": "ok"}


def test_readyz_reports_a_dead_broker(make_client: MakeClient) -> None:
    client = make_client(broker_url="redis://127.0.0.1:1/0")
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["checks"]["broker"].startswith("error")


def test_rate_limit_and_active_job_cap(make_client: MakeClient, tiny_job: dict[str, Any]) -> None:
    client = make_client(max_active_jobs_per_owner="2")
    assert client.post("/jobs", json=tiny_job).status_code == 201
    assert client.post("/jobs", json=tiny_job).status_code == 201
    r = client.post("/jobs", json=tiny_job)
    assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0
    assert json.loads(r.text)["code"] == "rate_limited"


def test_post_rate_limit_per_owner(make_client: MakeClient, tiny_job: dict[str, Any]) -> None:
    client = make_client(post_rate_per_minute="3", api_tokens="a:alice,b:bob")
    for _ in range(3):
        assert client.post("/jobs", json=tiny_job, headers={"Authorization": "Bearer a"}).status_code == 201
    r = client.post("/jobs", json=tiny_job, headers={"Authorization": "Bearer a"})
    assert r.status_code == 429 and 0 < int(r.headers["Retry-After"]) <= 61
    # Another owner has a budget of their own.
    assert client.post("/jobs", json=tiny_job, headers={"Authorization": "Bearer b"}).status_code == 201


def test_sqlite_store_has_no_read_pool(make_client: MakeClient, tiny_job: dict[str, Any]) -> None:
    from ftq.store import repository
    from ftq.store.db import session_scope
    from service.app import create_app

    first = make_client()
    job = first.post("/jobs", json=tiny_job).json()["id"]
    with session_scope() as s:
        repository.upsert_points(s, job, [{"step": i, "loss": 1.0} for i in (1, 2, 3)])
    with type(first)(create_app()) as client:
        assert client.app.state.read_pool is None  # type: ignore[attr-defined]
        assert [p["step"] for p in client.get(f"/jobs/{job}/metrics").json()["data"]] == [1, 2, 3]


def test_method_metrics_are_stored_merged_and_served_in_extra(
    make_client: MakeClient, store_url: str, tiny_job: dict[str, Any]
) -> None:
    """Point.extra through ingest's parse, the store's upsert (a train and an eval line of one step each
    bring their names; a line read twice changes nothing) and GET /jobs/{id}/metrics."""
    from ftq.store import repository
    from ftq.store.db import session_scope
    from worker.ingest import parse_point

    client = make_client(store_url)
    job = client.post("/jobs", json=tiny_job).json()["id"]
    lines = [
        {"step": 1, "loss": 0.69, "extra": {"rewards/margins": 0.05, "rewards/accuracies": 0.5}},
        {"step": 2, "loss": 0.6, "extra": {"rewards/margins": 0.2, "bad name!": 1.0, "nan": float("nan")}},
        {"step": 2, "eval_loss": 0.65, "extra": {"eval_rewards/margins": 0.15}},
        {"step": 3, "loss": 0.5},
    ]
    points = [parse_point(json.dumps(line).encode()) for line in lines]
    assert points[1] is not None and points[1]["extra"] == {"rewards/margins": 0.2}  # only TRL-like names
    with session_scope() as s:
        repository.upsert_points(s, job, [p for p in points[:2] if p])
    with session_scope() as s:
        repository.upsert_points(s, job, [p for p in points[2:] if p])  # the eval line, in a later pass
        repository.upsert_points(s, job, [p for p in points[:1] if p])  # read twice
    data = client.get(f"/jobs/{job}/metrics").json()["data"]
    assert [p["extra"] for p in data] == [
        {"rewards/margins": 0.05, "rewards/accuracies": 0.5},
        {"rewards/margins": 0.2, "eval_rewards/margins": 0.15},
        None,
    ]
    assert data[1]["loss"] == 0.6 and data[1]["eval_loss"] == 0.65
    assert (
        client.get(f"/jobs/{job}/metrics?after_step=1&limit=1").json()["data"][0]["extra"] == data[1]["extra"]
    )
