"""Evaluations in process on SQLite: the spec's suites (422s naming the field), the best checkpoint
(argmax/argmin, exactly one), the routes (202 shape, another owner's 404 on every one), the scheduler
placing an evaluation as the third kind of run, and rotation keeping the best and the unscored."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ftq.contract import runs
from ftq.contract.evaluation import Scored, best_of
from ftq.contract.spec import JobSpec
from ftq.contract.status import JobStatus
from ftq.runtime.settings import get_settings
from ftq.store import evaluations as ev_store
from ftq.store import repository
from ftq.store.db import session_scope
from ftq.store.models import Evaluation
from tests.harness.assets import checkpoint_dir
from tests.harness.inprocess import MakeClient
from worker import controller, evaluations

ALICE, BOB = "alice-eval-token", "bob-eval-token"
GRADER = {
    "type": "string_check",
    "name": "has_answer",
    "input": "{{sample.output_text}}",
    "reference": "{{item.answer}}",
    "operation": "ilike",
}


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def suites_spec(tiny_job: dict[str, Any], **eval_: Any) -> dict[str, Any]:
    spec = {**tiny_job}
    spec["eval"] = {
        "suites": [
            {"name": "qa", "type": "graders", "dataset": "./evaluation/qa.jsonl", "grader": GRADER},
            {"name": "bench", "type": "lm_eval", "tasks": ["tiny_mc"], "task_dir": "./evaluation/tasks"},
            {"name": "held", "type": "loss", "dataset": "./tiny/data/eval.jsonl"},
        ],
        "on": "checkpoint",
        "select": {"metric": "qa/score", "mode": "max"},
        **eval_,
    }
    return spec


def locs(r: Any) -> list[list[Any]]:
    return [e["loc"] for e in r.json()["detail"]]


def test_suites_validate_with_the_failing_field_named(
    make_client: MakeClient, store_url: str, tiny_job: Any
) -> None:
    client = make_client(store_url)
    ok = client.post("/jobs?dry_run=true", json=suites_spec(tiny_job))
    assert ok.status_code == 200, ok.text
    bad_select = suites_spec(tiny_job, select={"metric": "nope/score", "mode": "max"})
    r = client.post("/jobs", json=bad_select)
    assert r.status_code == 422 and locs(r) == [["body", "eval", "select"]], r.text
    assert "names no suite" in r.json()["detail"][0]["msg"]
    dup = suites_spec(tiny_job)
    dup["eval"]["suites"][1]["name"] = "qa"
    r = client.post("/jobs", json=dup)
    assert r.status_code == 422 and locs(r) == [["body", "eval", "suites", 1, "name"]], r.text
    outside = suites_spec(tiny_job)
    outside["eval"]["suites"][0]["dataset"] = "/etc/passwd.jsonl"
    r = client.post("/jobs", json=outside)
    assert r.status_code == 422 and locs(r) == [["body", "eval", "suites", 0, "dataset"]], r.text
    hub_like = suites_spec(tiny_job)
    hub_like["eval"]["suites"][1]["task_dir"] = "evaluation/tasks"
    r = client.post("/jobs", json=hub_like)
    assert r.status_code == 422 and locs(r) == [["body", "eval", "suites", 1, "task_dir"]], r.text
    both = suites_spec(tiny_job)
    both["eval"]["suites"][0]["file_id"] = "file_" + "0" * 24
    r = client.post("/jobs", json=both)
    assert r.status_code == 422 and locs(r) == [["body", "eval", "suites", 0, "graders"]], r.text
    upload = suites_spec(tiny_job)
    upload["eval"]["suites"][0] = {
        **upload["eval"]["suites"][0],
        "dataset": None,
        "file_id": "file_" + "0" * 24,
    }
    r = client.post("/jobs", json=upload)
    assert r.status_code == 422 and locs(r) == [["body", "eval", "suites", 0, "file_id"]], r.text
    with pytest.raises(ValidationError):
        JobSpec.model_validate({**tiny_job, "eval": {"select": {"metric": "qa/score"}}})
    with pytest.raises(ValidationError):  # an unknown suite type
        JobSpec.model_validate({**tiny_job, "eval": {"suites": [{"name": "x", "type": "bleu"}]}})


def test_the_best_is_the_argmax_or_argmin_and_only_one() -> None:
    scored = [
        Scored(2, {"qa/score": 0.5, "held/loss": 3.0}),
        Scored(4, {"qa/score": 0.75, "held/loss": 2.5}),
        Scored(6, {"qa/score": 0.75, "held/loss": 2.9}),  # a tie goes to the earlier step
        Scored(8, {"qa/score": float("nan"), "held/loss": float("nan")}),
        Scored(None, {"qa/score": 1.0, "held/loss": 0.1}),  # final/ is not a checkpoint
    ]
    best = best_of(scored, "qa/score", "max")
    assert best is not None and (best.step, best.value) == (4, 0.75)
    low = best_of(scored, "held/loss", "min")
    assert low is not None and (low.step, low.value) == (4, 2.5)
    assert best_of(scored, "other/score", "max") is None


def _succeed(eval_id: str, metrics: dict[str, float]) -> None:
    with session_scope() as s:
        ev_store.EVALUATIONS.mark_starting(s, eval_id, resources=None)  # or claimed by the scheduler already
        assert ev_store.EVALUATIONS.mark_running(s, eval_id, external_id=None, pid=None, pid_start_ticks=None)
        ev_store.store_metrics(s, eval_id, metrics)
        assert ev_store.EVALUATIONS.mark_finished(s, eval_id, JobStatus.succeeded, exit_code=0)
        s.commit()


def test_routes_scores_and_placement(make_client: MakeClient, store_url: str, tiny_job: Any) -> None:
    client = make_client(
        store_url, api_tokens=f"{ALICE}:alice,{BOB}:bob", cpu_slots="1", max_queued_evaluations_per_owner="2"
    )
    r = client.post("/jobs", json=suites_spec(tiny_job), headers=_auth(ALICE))
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    run_dir = runs.run_dir(get_settings().runs_dir, job_id)
    for step in (2, 4):
        checkpoint_dir(run_dir, step)
    assert controller.schedule() == [controller.Claim("job", job_id)]  # the job holds the one slot

    # The worker queues one evaluation per complete checkpoint, once.
    assert evaluations.queue_due() == 2
    assert evaluations.queue_due() == 0
    listed = client.get(f"/jobs/{job_id}/evaluations", headers=_auth(ALICE)).json()["data"]
    assert sorted(e["checkpoint"] for e in listed) == ["2", "4"]
    assert {e["trigger"] for e in listed} == {"checkpoint"}

    # On demand: 202 with the shape, a Location; final is refused before the job succeeded.
    r = client.post(
        f"/jobs/{job_id}/evaluations", json={"checkpoint": 2, "suites": ["bench"]}, headers=_auth(ALICE)
    )
    assert r.status_code == 202, r.text
    body = r.json()
    assert {"id", "job_id", "checkpoint", "status", "results", "error"} <= set(body)
    assert (body["checkpoint"], body["status"], body["results"], body["suites"]) == (
        "2",
        "queued",
        None,
        ["bench"],
    )
    assert r.headers["Location"] == f"/jobs/{job_id}/evaluations/{body['id']}"
    eid = body["id"]
    assert (
        client.post(
            f"/jobs/{job_id}/evaluations", json={"checkpoint": "final"}, headers=_auth(ALICE)
        ).status_code
        == 409
    )
    # The owner's cap on evaluations asked for and waiting (the two queued by eval.on do not count).
    r = client.post(f"/jobs/{job_id}/evaluations", json={"checkpoint": 4}, headers=_auth(ALICE))
    assert r.status_code == 202, r.text
    capped = client.post(f"/jobs/{job_id}/evaluations", json={"checkpoint": 4}, headers=_auth(ALICE))
    assert capped.status_code == 429 and "FTQ_MAX_QUEUED_EVALUATIONS_PER_OWNER" in capped.text, capped.text
    client.post(f"/jobs/{job_id}/evaluations/{r.json()['id']}/cancel", headers=_auth(ALICE))
    r = client.post(f"/jobs/{job_id}/evaluations", json={"checkpoint": 3}, headers=_auth(ALICE))
    assert r.status_code == 422 and locs(r) == [["body", "checkpoint"]], r.text
    r = client.post(f"/jobs/{job_id}/evaluations", json={"suites": ["nope"]}, headers=_auth(ALICE))
    assert r.status_code == 422 and locs(r) == [["body", "suites", 0]], r.text

    # The scheduler places evaluations with the jobs: all wait for the slot the job holds, with a reason.
    assert controller.schedule() == []
    one = client.get(f"/jobs/{job_id}/evaluations/{eid}", headers=_auth(ALICE)).json()
    assert one["queue"]["reason"] == "no_free_devices" and one["queue"]["position"] >= 1
    with session_scope() as s:
        assert repository.JOBS.mark_running(s, job_id, external_id=None, pid=None, pid_start_ticks=None)
        assert repository.JOBS.mark_finished(s, job_id, JobStatus.succeeded, exit_code=0)
        s.commit()
    claims = controller.schedule()
    assert len(claims) == 1 and claims[0].kind == "evaluation"

    # Scores: checkpoint rows carry metrics, exactly one is best (the argmax), the job names it.
    by_step = {e["checkpoint"]: e["id"] for e in listed}
    _succeed(by_step["2"], {"qa/score": 0.25, "held/loss": 3.0})
    _succeed(by_step["4"], {"qa/score": 0.75, "held/loss": 2.0})
    rows = client.get(f"/jobs/{job_id}/checkpoints", headers=_auth(ALICE)).json()["data"]
    assert [(c["step"], c["metrics"].get("qa/score"), c["best"]) for c in rows] == [
        (2, 0.25, False),
        (4, 0.75, True),
    ]
    job = client.get(f"/jobs/{job_id}", headers=_auth(ALICE)).json()
    assert job["best_checkpoint"] == {"step": 4, "metric": "qa/score", "value": 0.75}
    events = client.get(f"/jobs/{job_id}/events", headers=_auth(ALICE)).json()["data"]
    scored = [e["data"] for e in events if e["type"] == "job.evaluation"]
    assert [d["checkpoint"] for d in scored] == ["2", "4"]
    assert scored[-1]["best_checkpoint"]["step"] == 4 and scored[-1]["metrics"]["qa/score"] == 0.75
    # /v1: a checkpoint's full_valid_loss is what the loss suite scored it.
    v1 = client.get(
        f"/v1/fine_tuning/jobs/ftjob-{job_id.removeprefix('job_')}/checkpoints", headers=_auth(ALICE)
    )
    assert v1.status_code == 200, v1.text
    assert {c["step_number"]: c["metrics"]["full_valid_loss"] for c in v1.json()["data"]} == {4: 2.0, 2: 3.0}
    # The two that ran count in alice's usage, as exports do.
    assert client.get("/usage", headers=_auth(ALICE)).json()["data"][0]["evaluations"] == 2
    r = client.post(f"/jobs/{job_id}/evaluations", json={"checkpoint": "best"}, headers=_auth(ALICE))
    assert r.status_code == 202 and r.json()["checkpoint"] == "4", r.text

    # Cancel: a queued one is cancelled at once; again changes nothing.
    r = client.post(f"/jobs/{job_id}/evaluations/{eid}/cancel", headers=_auth(ALICE))
    assert r.status_code == 202 and r.json()["status"] in ("cancelled", "cancelling"), r.text

    # Another owner: 404 on every route, and nothing of alice's in bob's views.
    for method, path, payload in (
        ("post", f"/jobs/{job_id}/evaluations", {"checkpoint": 2}),
        ("get", f"/jobs/{job_id}/evaluations", None),
        ("get", f"/jobs/{job_id}/evaluations/{eid}", None),
        ("post", f"/jobs/{job_id}/evaluations/{eid}/cancel", None),
        ("get", f"/jobs/{job_id}/checkpoints", None),
    ):
        r = client.request(method.upper(), path, json=payload, headers=_auth(BOB))
        assert r.status_code == 404, (method, path, r.text)


def test_rotation_keeps_the_best_and_the_unscored() -> None:
    spec = {"training": {"save_total_limit": 1}, "eval": {"select": {"metric": "qa/score", "mode": "max"}}}

    def row(seq: int, step: int, status: str, score: float | None = None) -> Evaluation:
        return Evaluation(
            seq=seq, id=f"e{seq}", job_id="j", step=step, trigger="checkpoint", status=status,
            metrics={"qa/score": score} if score is not None else None,
        )  # fmt: skip

    rows = [
        row(1, 2, "succeeded", 0.9),
        row(2, 4, "succeeded", 0.1),
        row(3, 6, "succeeded", 0.2),
        row(4, 8, "running"),
    ]
    # 2 is the best, 8 the newest (and not scored yet): 4 and 6 may go.
    assert evaluations.keep(spec, [2, 4, 6, 8], rows) == {2, 8}
    assert evaluations.keep({"training": {}}, [2, 4], rows) == {2, 4}  # no limit: all kept


def test_a_webhook_for_an_evaluation_says_the_jobs_status_then() -> None:
    """job.evaluation may come after the job succeeded: the delivery says so, not `running`."""
    import json
    from datetime import UTC, datetime

    from ftq.store.events import Due
    from worker.webhooks import payload

    due = Due(
        delivery_id=1, webhook_id="wh", url="http://127.0.0.1/", secret="s", event_id=7,
        event_type="job.evaluation", event_time=datetime.now(UTC), job_id="j", job_name="rich",
        data={"checkpoint": "final", "metrics": {"qa/score": 0.5}, "job_status": "succeeded"},
        attempts=0, first_attempt_at=None,
    )  # fmt: skip
    body = json.loads(payload(due))
    assert body["type"] == "job.evaluation" and body["data"]["job"]["status"] == "succeeded"
    assert body["data"]["metrics"] == {"qa/score": 0.5}


def test_a_request_naming_a_suite_twice_or_a_boolean_checkpoint_is_a_422(
    make_client: MakeClient, store_url: str, tiny_job: Any
) -> None:
    """Issue 48: `checkpoint: true` was read as the step 1 (an evaluation of checkpoint-1 was queued), and
    an export's as well; a suite named twice in a request ran once but was listed twice."""
    client = make_client(store_url)
    r = client.post("/jobs", json=suites_spec(tiny_job))
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    checkpoint_dir(runs.run_dir(get_settings().runs_dir, job_id), 1)
    for value in (True, False):
        r = client.post(f"/jobs/{job_id}/evaluations", json={"checkpoint": value})
        assert r.status_code == 422 and locs(r) == [["body", "checkpoint"]], r.text
        assert "not a checkpoint" in r.json()["detail"][0]["msg"]
        r = client.post(f"/jobs/{job_id}/exports", json={"kind": "adapter", "checkpoint": value})
        assert r.status_code == 422 and locs(r) == [["body", "checkpoint"]], r.text
    r = client.post(f"/jobs/{job_id}/evaluations", json={"checkpoint": 1, "suites": ["qa", "held", "qa"]})
    assert r.status_code == 422 and locs(r) == [["body", "suites", 2]], r.text
    assert client.get(f"/jobs/{job_id}/evaluations").json()["data"] == []
    ok = client.post(f"/jobs/{job_id}/evaluations", json={"checkpoint": 1, "suites": ["qa"]})
    assert ok.status_code == 202 and ok.json()["checkpoint"] == "1", ok.text
