"""The dashboard's checkpoints table and compare view in headless Chromium, on the bank's rich job once its
evaluations ended (tests/e2e/evaluations): each checkpoint row shows its metrics and exactly the best one is
marked; the compare view plots the chosen metric (?metric=). A screenshot goes to
tests/_artifacts/checkpoints-table.png."""

from __future__ import annotations

import time
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.bank import ALICE, SELECT_METRIC, BankedRun
from tests.harness import ARTIFACTS

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_checkpoints_table_and_compare_by_metric(rich_job: BankedRun, page: Any) -> None:
    dep, job_id = rich_job.dep, rich_job.id
    deadline = time.monotonic() + 420
    while True:  # every checkpoint scored (the evaluations run after the job's end too)
        rows = dep.get(f"/jobs/{job_id}/checkpoints")["data"]
        if all(SELECT_METRIC in r["metrics"] for r in rows) or time.monotonic() > deadline:
            break
        time.sleep(1)
    best = next(r for r in rows if r["best"])
    page.goto(f"{dep.url}/ui/jobs/{job_id}?token={ALICE}")
    table = page.locator("#checkpoints")
    expect(table.locator("th", has_text=SELECT_METRIC)).to_have_count(1, timeout=30_000)
    expect(table.locator("tbody tr")).to_have_count(len(rows))
    expect(table.locator("tr.best")).to_have_count(1)
    expect(table.locator("tr.best")).to_have_attribute("data-step", str(best["step"]))
    expect(table.locator("tr.best td.best-mark")).to_have_text("★ best")
    page.locator("#outputs").screenshot(path=str(ARTIFACTS / "checkpoints-table.png"))

    page.goto(f"{dep.url}/?token={ALICE}&compare={job_id}&metric={SELECT_METRIC}")
    expect(page.locator("#compare-title")).to_have_text(SELECT_METRIC, timeout=30_000)
    expect(page.locator("#compare-metric")).to_have_value(SELECT_METRIC)
    expect(page.locator(f'#chart-compare path[data-series="{job_id}"]')).to_have_count(1)
