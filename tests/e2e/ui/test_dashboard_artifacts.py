"""The job page's artifacts card in real headless Chromium: every file of the run with a download link
and a .tar link per folder; a click saves the bytes the API lists (sha256), with auth off (a plain link)
and on (the tab's token sent by the page, which a plain link could not carry)."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.session import FinishedJob
from tests.harness import ARTIFACTS, Deployment, config_only_model, text_dataset

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


def test_with_a_token_a_click_downloads_through_the_api(tmp_path: Path, page: Any) -> None:
    data = tmp_path / "data"
    config_only_model(data / "model")
    text_dataset(data / "data" / "train.jsonl")
    with Deployment(tmp_path, mode="api", data_dir=data, tokens={"ann": "ann-ui-token"}) as dep:
        job = dep.post_job(
            {
                "name": "ui-artifacts",
                "model": {"name_or_path": "./model"},
                "dataset": {"name_or_path": "./data/train.jsonl", "text_field": "text"},
                "training": {"max_steps": 1, "max_seq_len": 32, "mixed_precision": "no"},
                "resources": {"device": "cpu", "processes_per_node": 1},
            }
        )
        dep.cancel(job["id"])  # a terminal job: the page stops polling
        final = dep.run_dir(job["id"]) / "final"
        final.mkdir(parents=True)
        content = bytes(range(256)) * 40
        (final / "adapter_model.safetensors").write_bytes(content)
        page.goto(f"{dep.url}/ui/jobs/{job['id']}?token=ann-ui-token")
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
