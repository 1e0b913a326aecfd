"""The job page's artifacts card in real headless Chromium: every file of the run with a download link
and a .tar link per folder; a click saves the bytes the API lists (sha256), with auth off (a plain link, the
session's server) and on (the bank's: the tab's token sent by the page, which a plain link could not
carry)."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.bank import ALICE, BankedRun
from tests.e2e.session import FinishedJob
from tests.harness import ARTIFACTS, Deployment

pytestmark = pytest.mark.browser


def _sha(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.slow  # the session's real tiny training run
def test_job_page_lists_artifacts_with_download_links(
    server: Deployment, finished_job: FinishedJob, page: Any, tmp_path: Path
) -> None:
    job_id = finished_job.job_id
    listed = server.get(f"/jobs/{job_id}/artifacts")["data"]
    page.goto(f"{server.url}/ui/jobs/{job_id}")
    expect(page.locator("#refresh-state")).to_contain_text("no more updates", timeout=30_000)
    rows = page.locator("#artifact-files tr")
    expect(rows).to_have_count(len(listed))
    adapter = page.locator('#artifact-files tr[data-path="final/adapter_model.safetensors"]')
    expect(adapter).to_have_attribute("data-kind", "adapter")
    link = adapter.locator("a")
    expect(link).to_have_attribute("href", f"/jobs/{job_id}/artifacts/final/adapter_model.safetensors")
    folders = page.locator("#artifact-folders a")
    expect(folders).to_have_text(
        ["final.tar", "checkpoints/checkpoint-20.tar", "checkpoints/checkpoint-40.tar"]
    )
    page.locator("#artifacts").screenshot(path=str(ARTIFACTS / "dashboard-artifacts.png"))

    with page.expect_download() as info:
        link.click()
    saved = tmp_path / "adapter"
    info.value.save_as(saved)
    want = next(a for a in listed if a["path"] == "final/adapter_model.safetensors")
    assert info.value.suggested_filename == "adapter_model.safetensors"
    assert saved.stat().st_size == want["size"]
    assert want["sha256"] is None or _sha(saved) == want["sha256"]

    with page.expect_download() as info:
        folders.first.click()
    saved_tar = tmp_path / "final.tar"
    info.value.save_as(saved_tar)
    with tarfile.open(saved_tar) as tar:
        assert "final/adapter_model.safetensors" in tar.getnames()


def test_with_a_token_a_click_downloads_through_the_api(
    rich_job: BankedRun, tmp_path: Path, page: Any
) -> None:
    # The bank's `ftq up` has tokens; its rich job (alice's, succeeded: the page stops polling) has an
    # adapter.
    dep, job_id = rich_job.dep, rich_job.id
    content = (dep.run_dir(job_id) / "final" / "adapter_model.safetensors").read_bytes()
    page.goto(f"{dep.url}/ui/jobs/{job_id}?token={ALICE}")
    link = page.locator('#artifact-files tr[data-path="final/adapter_model.safetensors"] a')
    expect(link).to_be_visible()
    # Without the token the link itself is refused: the click must send it.
    with dep.client() as anonymous:
        assert anonymous.get(link.get_attribute("href")).status_code == 401
    with page.expect_download() as info:
        link.click()
    saved = tmp_path / "saved"
    info.value.save_as(saved)
    assert saved.read_bytes() == content
    expect(page.locator("#banner")).to_be_hidden()
