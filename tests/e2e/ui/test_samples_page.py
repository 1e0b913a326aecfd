"""The job page's samples table in real headless Chromium against the session's `ftq up`: a tiny job with
two sample prompts and an eval split trains to its end, and the page lists every sample the API serves, by
step, then stops polling. A screenshot goes to tests/_artifacts/samples-page.png."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.harness import ARTIFACTS, TINY_RELATIVE, Deployment, tiny_spec

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PROMPTS = ["one two three", "the cat <b>sat</b>"]  # markup in a prompt is shown as text, never run


@pytest.fixture(scope="module")
def sampled(server: Deployment) -> tuple[Deployment, str]:
    spec = tiny_spec(TINY_RELATIVE, name="sampled", max_steps=4, eval_steps=2)
    spec["dataset"] = {"name_or_path": f"{TINY_RELATIVE}/data", "eval_split": "eval"}
    spec["eval"] = {"sample_prompts": PROMPTS, "sample_max_new_tokens": 8}
    job = server.post_job(spec)
    done = server.wait_terminal(job["id"], timeout=400)
    assert done["status"] == "succeeded", server.report(job["id"])
    return server, str(job["id"])


def test_job_page_lists_the_samples_by_step(sampled: tuple[Deployment, str], page: Any) -> None:
    dep, job_id = sampled
    served = dep.get(f"/jobs/{job_id}/samples")["data"]
    assert [s["step"] for s in served] == [2, 2, 4, 4]
    page.goto(f"{dep.url}/ui/jobs/{job_id}")
    expect(page.locator("#refresh-state")).to_contain_text("no more updates", timeout=60_000)
    expect(page.locator("#samples-card")).to_be_visible()
    rows = page.locator("#samples-table tr[data-step]")
    expect(rows).to_have_count(len(served))
    for i, s in enumerate(served):
        row = rows.nth(i)
        assert row.get_attribute("data-step") == str(s["step"])
        expect(row.locator("td.prompt")).to_have_text(s["prompt"])
        expect(row.locator("td.completion")).to_have_text(s["completion"])
    assert page.locator("#samples-table b").count() == 0
    page.screenshot(path=str(ARTIFACTS / "samples-page.png"), full_page=True)
