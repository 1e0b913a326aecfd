"""Samples during training end to end, through HTTP only on a real `ftq up` with two owners (the bank's,
tests/e2e/bank.py): its rich job, with an eval split and two sample prompts, succeeds, and GET
/jobs/{id}/samples holds one completion per prompt per evaluation (the steps its eval loss was logged at);
`ftq samples` and the SDK show the same; another owner gets 404; bad sample settings are a 422 naming the
field."""

from __future__ import annotations

from typing import Any

import pytest

from ftq.client import Client
from tests.e2e.bank import ALICE, BOB, PROMPTS, BankedRun, rich_spec
from tests.harness import Deployment, run_ftq


@pytest.fixture(scope="module")
def dep(bank_dep: Deployment) -> Deployment:
    return bank_dep


@pytest.fixture(scope="module")
def finished(rich_job: BankedRun) -> str:
    return rich_job.id


def sampled_spec() -> dict[str, Any]:
    return rich_spec()


@pytest.mark.slow  # a real tiny training run
def test_a_completion_per_prompt_per_eval(dep: Deployment, finished: str) -> None:
    page = dep.get(f"/jobs/{finished}/samples")
    assert page["complete"] is True
    eval_steps = [
        p["step"] for p in dep.get(f"/jobs/{finished}/metrics")["data"] if p["eval_loss"] is not None
    ]
    assert eval_steps == [2, 4]
    assert [(s["step"], s["index"], s["prompt"]) for s in page["data"]] == [
        (step, i, p) for step in eval_steps for i, p in enumerate(PROMPTS)
    ]
    assert all(isinstance(s["completion"], str) for s in page["data"])
    assert page["next_after_step"] == 4
    after = dep.get(f"/jobs/{finished}/samples", after_step=2)["data"]
    assert {s["step"] for s in after} == {4}
    # What the API serves is what the trainer wrote, line for line.
    lines = (dep.run_dir(finished) / "samples.jsonl").read_text().splitlines()
    assert len(lines) == len(page["data"])


@pytest.mark.slow
def test_cli_and_sdk_show_the_samples(dep: Deployment, finished: str) -> None:
    with Client(dep.url, ALICE) as client:
        every = list(client.jobs.iter_samples(finished, follow=True, poll=0.2))
        assert client.jobs.samples(finished, after_step=-1).data == every
    shown = run_ftq("samples", finished, url=dep.url, token=ALICE)
    assert shown.returncode == 0, shown.stderr
    assert "step 2" in shown.stdout and "step 4" in shown.stdout
    for s in every:
        assert s.prompt in shown.stdout and s.completion.strip() in shown.stdout
    as_json = run_ftq("samples", finished, "--json", url=dep.url, token=ALICE)
    assert len(as_json.stdout.splitlines()) == len(every)


@pytest.mark.slow
def test_another_owner_gets_404(dep: Deployment, finished: str) -> None:
    with dep.client(BOB) as bob:
        r = bob.get(f"/jobs/{finished}/samples")
        assert r.status_code == 404 and PROMPTS[0] not in r.text
    foreign = run_ftq("samples", finished, url=dep.url, token=BOB)
    assert foreign.returncode == 1 and "not found" in foreign.stderr


def test_bad_sample_settings_are_422(dep: Deployment) -> None:
    with dep.client(ALICE) as alice:
        for eval_, loc in [
            ({"sample_prompts": [f"p{i}" for i in range(20)]}, ["body", "eval", "sample_prompts"]),
            (
                {"sample_prompts": ["ok"], "sample_max_new_tokens": 4096},
                ["body", "eval", "sample_max_new_tokens"],
            ),
            ({"sample_prompts": ["x" * 5000]}, ["body", "eval", "sample_prompts", 0]),
        ]:
            r = alice.post("/jobs", json={**sampled_spec(), "eval": eval_})
            assert r.status_code == 422, r.text
            assert r.json()["detail"][0]["loc"] == loc
