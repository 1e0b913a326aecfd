"""GET /jobs/{id}/samples in process: whole steps per page, after_step, complete, owners, and the spec's
`eval` section refused with a 422 naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.inprocess import MakeClient


def _store_samples(job_id: str, steps: list[int], prompts: list[str]) -> None:
    from ftq.store import repository
    from ftq.store.db import session_scope

    with session_scope() as s:
        repository.upsert_samples(
            s,
            job_id,
            [
                {"step": step, "index": i, "prompt": p, "completion": f"{p} @ {step}", "time": 1.0}
                for step in steps
                for i, p in enumerate(prompts)
            ],
        )
        s.commit()


def test_pages_hold_whole_steps_in_order(
    make_client: MakeClient, store_url: str, tiny_job: dict[str, Any]
) -> None:
    client = make_client(store_url)
    prompts = ["one two", "three"]
    job = client.post("/jobs", json={**tiny_job, "eval": {"sample_prompts": prompts}}).json()
    empty = client.get(f"/jobs/{job['id']}/samples").json()
    assert empty == {"data": [], "next_after_step": -1, "complete": False}

    _store_samples(job["id"], [2, 4, 6, 8], prompts)
    page = client.get(f"/jobs/{job['id']}/samples?after_step=-1&limit=3").json()
    assert [(s["step"], s["index"]) for s in page["data"]] == [(st, i) for st in (2, 4, 6) for i in (0, 1)]
    assert page["data"][1] == {
        "step": 2,
        "index": 1,
        "prompt": "three",
        "completion": "three @ 2",
        "time": 1.0,
        "reward": None,  # a sample prompt's completion; GRPO's rollouts carry their reward
    }
    assert page["next_after_step"] == 6 and page["complete"] is False
    rest = client.get(f"/jobs/{job['id']}/samples?after_step=6").json()
    assert [s["step"] for s in rest["data"]] == [8, 8] and rest["next_after_step"] == 8
    assert rest["complete"] is False  # the job has not ended

    # A resumed run that samples step 4 again replaces its rows instead of adding more.
    from ftq.store import repository
    from ftq.store.db import session_scope

    with session_scope() as s:
        repository.upsert_samples(
            s, job["id"], [{"step": 4, "index": 0, "prompt": "one two", "completion": "new"}]
        )
        s.commit()
    again = client.get(f"/jobs/{job['id']}/samples?after_step=2&limit=1").json()["data"]
    assert [(s["index"], s["completion"]) for s in again] == [(0, "new"), (1, "three @ 4")]
    # A GRPO rollout (index 8 and up, trainer.rewards) keeps its reward.
    with session_scope() as s:
        rollout = {"step": 4, "index": 8, "prompt": "2+2", "completion": "4", "reward": 0.75}
        repository.upsert_samples(s, job["id"], [rollout])
        s.commit()
    step4 = client.get(f"/jobs/{job['id']}/samples?after_step=2&limit=1").json()["data"]
    assert [(s["index"], s["reward"]) for s in step4] == [(0, None), (1, None), (8, 0.75)]

    client.post(f"/jobs/{job['id']}/cancel")  # a queued job is cancelled at once: terminal
    done = client.get(f"/jobs/{job['id']}/samples?after_step=6").json()
    assert done["complete"] is True


def test_samples_are_the_owners_alone(make_client: MakeClient, tiny_job: dict[str, Any]) -> None:
    client = make_client(api_tokens="tok-a:alice,tok-b:bob")
    alice, bob = {"Authorization": "Bearer tok-a"}, {"Authorization": "Bearer tok-b"}
    job = client.post("/jobs", json={**tiny_job, "eval": {"sample_prompts": ["x"]}}, headers=alice).json()
    _store_samples(job["id"], [2], ["x"])
    assert client.get(f"/jobs/{job['id']}/samples", headers=alice).json()["data"][0]["completion"] == "x @ 2"
    foreign = client.get(f"/jobs/{job['id']}/samples", headers=bob)
    assert foreign.status_code == 404 and "x @ 2" not in foreign.text
    assert client.get("/jobs/job_nope/samples", headers=alice).status_code == 404
    assert client.get(f"/jobs/{job['id']}/samples").status_code == 401


@pytest.mark.parametrize(
    ("eval_", "loc"),
    [
        ({"sample_prompts": [f"prompt {i}" for i in range(9)]}, ["body", "eval", "sample_prompts"]),
        ({"sample_prompts": ["x" * 2001]}, ["body", "eval", "sample_prompts", 0]),
        (
            {"sample_prompts": ["ok"], "sample_max_new_tokens": 100000},
            ["body", "eval", "sample_max_new_tokens"],
        ),
        ({"sample_promts": ["ok"]}, ["body", "eval", "sample_promts"]),
    ],
)
def test_bad_sample_settings_are_422_naming_the_field(
    make_client: MakeClient, tiny_job: dict[str, Any], eval_: dict[str, Any], loc: list[Any]
) -> None:
    r = make_client().post("/jobs", json={**tiny_job, "eval": eval_})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc


def test_bad_query_is_422(make_client: MakeClient, tiny_job: dict[str, Any]) -> None:
    client = make_client()
    job = client.post("/jobs", json=tiny_job).json()
    assert client.get(f"/jobs/{job['id']}/samples?after_step=-2").status_code == 422
    assert client.get(f"/jobs/{job['id']}/samples?limit=0").status_code == 422
