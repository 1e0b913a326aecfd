"""The job page's samples table in real headless Chromium against the bank's `ftq up` (tests/e2e/bank.py):
its rich job, with two sample prompts and an eval split, has trained to its end, and the page (opened with
alice's token in the URL) lists every sample the API serves, by step, then stops polling. A screenshot goes
to tests/_artifacts/samples-page.png."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.bank import ALICE, BankedRun
from tests.harness import ARTIFACTS, Deployment

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def sampled(rich_job: BankedRun) -> tuple[Deployment, str]:
    return rich_job.dep, rich_job.id


def test_job_page_lists_the_samples_by_step(sampled: tuple[Deployment, str], page: Any) -> None:
    dep, job_id = sampled
    served = dep.get(f"/jobs/{job_id}/samples")["data"]
    assert [s["step"] for s in served] == [2, 2, 4, 4]
    page.goto(f"{dep.url}/ui/jobs/{job_id}?token={ALICE}")
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
