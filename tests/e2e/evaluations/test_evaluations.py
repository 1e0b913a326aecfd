"""Evaluations end to end on the bank's rich job (tests/e2e/bank.py: a graders suite and a local lm-eval
task, `on: checkpoint`, selected by `qa/score`): every checkpoint is scored by an evaluation that ran as a
launch of its own; exactly one checkpoint is best and it is the argmax; final/ is scored after success; an
evaluation of `final` on demand returns lm-eval's accuracy; the best checkpoint exports and loads, its
model card holding its scores; another owner gets 404 on every new route."""

from __future__ import annotations

import math
import tarfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.bank import ALICE, BOB, SELECT_METRIC, BankedRun

pytestmark = pytest.mark.slow

TERMINAL = ("succeeded", "failed", "cancelled")
ACC = "bench/tiny_mc/acc"


def _wait(c: httpx.Client, path: str, done: Any, timeout: float = 420) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        r = c.get(path)
        assert r.status_code == 200, r.text
        last = r.json()
        if done(last):
            return last
        time.sleep(0.5)
    raise AssertionError(f"{path} not done in {timeout}s: {last}")


def _all_scored(evals: dict[str, Any]) -> bool:
    auto = [e for e in evals["data"] if e["trigger"] != "request"]
    return {e["checkpoint"] for e in auto} >= {"2", "4", "final"} and all(
        e["status"] in TERMINAL for e in auto
    )


@pytest.fixture(scope="module")
def scored(rich_job: BankedRun) -> dict[str, Any]:
    """The rich job once its checkpoints' and final/'s evaluations ended (and how long they took)."""
    with rich_job.dep.client(ALICE) as c:
        evals = _wait(c, f"/jobs/{rich_job.id}/evaluations", _all_scored)
    return {"evaluations": evals["data"], "job_finished": rich_job.job["finished_at"]}


def test_every_checkpoint_is_scored_and_the_best_is_the_argmax(
    rich_job: BankedRun, scored: dict[str, Any]
) -> None:
    evals = scored["evaluations"]
    for e in evals:
        assert e["status"] == "succeeded", (e, rich_job.dep.report(rich_job.id))
        assert e["results"][SELECT_METRIC] >= 0 and 0 <= e["results"][ACC] <= 1, e
    with rich_job.dep.client(ALICE) as c:
        rows = c.get(f"/jobs/{rich_job.id}/checkpoints").json()["data"]
        job = c.get(f"/jobs/{rich_job.id}").json()
        events = c.get(f"/jobs/{rich_job.id}/events").json()["data"]
    assert [r["step"] for r in rows] == [2, 4]
    assert all(SELECT_METRIC in r["metrics"] and ACC in r["metrics"] for r in rows), rows
    best = [r for r in rows if r["best"]]
    assert len(best) == 1, rows
    top = max(r["metrics"][SELECT_METRIC] for r in rows)
    # The argmax; a tie goes to the earlier step.
    assert best[0]["step"] == min(r["step"] for r in rows if r["metrics"][SELECT_METRIC] == top)
    assert job["best_checkpoint"] == {"step": best[0]["step"], "metric": SELECT_METRIC, "value": top}
    # Each one scored was a job.evaluation event (webhooks send the same).
    checkpoints = {e["data"]["checkpoint"] for e in events if e["type"] == "job.evaluation"}
    assert checkpoints >= {"2", "4", "final"}, events
    # Each ran as a launch of its own in the run directory's evaluations/<id>/.
    for e in evals:
        assert (rich_job.dep.run_dir(rich_job.id) / "evaluations" / e["id"] / "results.json").is_file()
    spent = sum(_seconds(e) for e in evals)
    job = rich_job.job
    trained = _seconds({"started_at": job["created_at"], "finished_at": job["finished_at"]})
    after = max(_seconds({"started_at": job["finished_at"], "finished_at": e["finished_at"]}) for e in evals)
    print(
        f"\nrich job: created to succeeded {trained:.1f} s; its {len(evals)} evaluations: {spent:.1f} s "
        f"of run time, the last ended {after:.1f} s after the job"
    )


def _seconds(e: dict[str, Any]) -> float:
    from datetime import datetime

    return (
        datetime.fromisoformat(e["finished_at"]) - datetime.fromisoformat(e["started_at"])
    ).total_seconds()


def test_an_evaluation_of_final_on_demand_returns_lm_evals_accuracy(
    rich_job: BankedRun, scored: dict[str, Any]
) -> None:
    with rich_job.dep.client(ALICE) as c:
        r = c.post(f"/jobs/{rich_job.id}/evaluations", json={"checkpoint": "final", "suites": ["bench"]})
        assert r.status_code == 202, r.text
        made = r.json()
        assert {"id", "job_id", "checkpoint", "status", "results", "error"} <= set(made)
        assert (made["job_id"], made["checkpoint"], made["status"]) == (rich_job.id, "final", "queued")
        done = _wait(c, f"/jobs/{rich_job.id}/evaluations/{made['id']}", lambda e: e["status"] in TERMINAL)
    assert done["status"] == "succeeded", done
    acc = done["results"][ACC]
    assert 0 <= acc <= 1 and not math.isnan(acc)
    assert set(done["results"]) == {k for k in done["results"] if k.startswith("bench/")}  # only that suite
    # The same checkpoint scored by the automatic evaluation of final/: the same accuracy (deterministic).
    final = next(e for e in scored["evaluations"] if e["checkpoint"] == "final")
    assert final["results"][ACC] == acc


def test_the_best_checkpoint_exports_and_loads(
    rich_job: BankedRun, scored: dict[str, Any], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    with rich_job.dep.client(ALICE) as c:
        best = c.get(f"/jobs/{rich_job.id}").json()["best_checkpoint"]
        r = c.post(
            f"/jobs/{rich_job.id}/exports", json={"kind": "merged", "dtype": "fp32", "checkpoint": "best"}
        )
        assert r.status_code == 202, r.text
        assert r.json()["checkpoint"] == str(best["step"])
        export = _wait(c, f"/jobs/{rich_job.id}/exports/{r.json()['id']}", lambda e: e["status"] in TERMINAL)
        assert export["status"] == "succeeded", export
        with c.stream("GET", f"/jobs/{rich_job.id}/artifacts/{export['path']}.tar") as resp:
            assert resp.status_code == 200
            (tmp_path / "e.tar").write_bytes(b"".join(resp.iter_bytes()))
    with tarfile.open(tmp_path / "e.tar") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    folder = next(p.parent for p in (tmp_path / "x").rglob("config.json"))
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    assert sum(p.numel() for p in model.parameters()) > 0
    card = (folder / "README.md").read_text()
    assert f"step {best['step']}, the best by {SELECT_METRIC}" in card and "## Evaluation" in card, card
    assert SELECT_METRIC in card


def test_another_owner_gets_404_on_every_new_route(rich_job: BankedRun, scored: dict[str, Any]) -> None:
    eid = scored["evaluations"][0]["id"]
    job = rich_job.id
    with rich_job.dep.client(BOB) as c:
        for method, path, body in (
            ("POST", f"/jobs/{job}/evaluations", {"checkpoint": "final"}),
            ("GET", f"/jobs/{job}/evaluations", None),
            ("GET", f"/jobs/{job}/evaluations/{eid}", None),
            ("POST", f"/jobs/{job}/evaluations/{eid}/cancel", None),
            ("GET", f"/jobs/{job}/checkpoints", None),
            ("POST", f"/jobs/{job}/exports", {"kind": "merged", "checkpoint": "best"}),
        ):
            r = c.request(method, path, json=body)
            assert r.status_code == 404, (method, path, r.text)
        assert all(e["job_id"] != job for e in c.get("/events").json()["data"])


def test_the_cli_lists_evaluations_and_refuses_a_bad_checkpoint(
    rich_job: BankedRun, scored: dict[str, Any]
) -> None:
    from tests.harness import run_ftq

    listed = run_ftq("evals", rich_job.id, url=rich_job.dep.url, token=ALICE)
    assert listed.returncode == 0, listed.stderr
    for e in scored["evaluations"]:
        assert e["id"] in listed.stdout
    shown = {line.split()[0] for line in listed.stdout.splitlines() if line.startswith("  ")}
    assert {SELECT_METRIC, ACC} <= shown, listed.stdout  # one metric a line, under its evaluation
    bad = run_ftq("eval", rich_job.id, "--checkpoint", "latest", url=rich_job.dep.url, token=ALICE)
    assert bad.returncode == 2 and "final, best or a step" in bad.stderr
    gone = run_ftq("eval", rich_job.id, "--checkpoint", "3", url=rich_job.dep.url, token=ALICE)
    assert gone.returncode != 0 and "no checkpoint at step 3" in gone.stderr, gone.stderr
