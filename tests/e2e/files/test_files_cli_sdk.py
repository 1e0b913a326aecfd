"""`ftq files ...`, `ftq submit --upload` and the SDK's `client.files` against the real `ftq up`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from ftq.client import Client, NotFound
from tests.e2e.files.conftest import ALICE, BOB
from tests.harness import SDK_STYLES, Deployment, run_ftq, sdk_client, tiny_spec


@pytest.mark.parametrize("style", SDK_STYLES)
def test_sdk_uploads_waits_reads_and_deletes(
    files_server: Deployment, tiny: Path, tmp_path: Path, style: str
) -> None:
    path = tiny / "data" / "train.jsonl"
    seen: list[tuple[int, int]] = []
    with sdk_client(style, files_server.url, ALICE) as client:
        f = client.files.upload(path, progress=lambda sent, total: seen.append((sent, total)))
        assert f.filename == "train.jsonl" and f.bytes == path.stat().st_size
        assert seen and seen[-1] == (f.bytes, f.bytes)
        done = client.files.wait(f.id, timeout=60)
        assert done.status == "ready" and done.rows == len(path.read_text().splitlines())
        assert f.id in [x.id for x in client.files.list()]
        assert client.files.content(f.id) == path.read_bytes()
        assert client.files.download(f.id, tmp_path / "copy.jsonl").read_bytes() == path.read_bytes()
        client.files.delete(f.id)
        with pytest.raises(NotFound):
            client.files.get(f.id)
    with sdk_client(style, files_server.url, BOB) as bob, pytest.raises(NotFound):
        bob.files.delete(f.id)


def test_cli_upload_waits_and_prints_the_validation(files_server: Deployment, tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"prompt": "2+2?", "completion": "4"}) + "\n" for _ in range(3)))
    result = run_ftq("files", "upload", str(good), url=files_server.url, token=ALICE)
    assert result.returncode == 0, result.stderr
    assert "ready" in result.stdout and "rows: 3" in result.stdout
    assert "prompt_completion" in result.stdout
    file_id = re.search(r"(file_[0-9a-f]{24})", result.stdout).group(1)  # type: ignore[union-attr]

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": "b"\n')
    result = run_ftq("files", "upload", str(bad), url=files_server.url, token=ALICE)
    assert result.returncode == 1
    assert "invalid" in result.stdout and "line 2" in result.stdout

    shown = run_ftq("files", "show", file_id, url=files_server.url, token=ALICE)
    assert shown.returncode == 0 and "rows: 3" in shown.stdout
    listed = run_ftq("files", "ls", url=files_server.url, token=ALICE)
    assert listed.returncode == 0 and file_id in listed.stdout
    removed = run_ftq("files", "rm", file_id, url=files_server.url, token=ALICE)
    assert removed.returncode == 0, removed.stderr
    gone = run_ftq("files", "show", file_id, url=files_server.url, token=ALICE)
    assert gone.returncode == 1 and "not found" in gone.stderr


def test_submit_upload_rewrites_the_spec_to_the_file_id(
    files_server: Deployment, tiny: Path, tmp_path: Path
) -> None:
    data = tmp_path / "mine.jsonl"
    data.write_bytes((tiny / "data" / "train.jsonl").read_bytes())
    spec = tiny_spec(tiny)
    spec["dataset"] = {"name_or_path": "./mine.jsonl", "text_field": "text"}
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    result = run_ftq("submit", "--upload", "--dry-run", str(spec_file), url=files_server.url, token=ALICE)
    assert result.returncode == 0, result.stdout + result.stderr
    file_id = re.search(r"(file_[0-9a-f]{24})", result.stdout).group(1)  # type: ignore[union-attr]
    assert f"source: {file_id}" in result.stdout
    with Client(files_server.url, ALICE) as client:
        assert client.files.get(file_id).filename == "mine.jsonl"


def test_submit_upload_of_a_folder_uploads_its_train_and_eval_files(
    files_server: Deployment, tiny: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(tiny)
    spec["dataset"] = {"name_or_path": str(tiny / "data"), "eval_split": "eval", "text_field": "text"}
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    result = run_ftq("submit", "--upload", "--dry-run", str(spec_file), url=files_server.url, token=ALICE)
    assert result.returncode == 0, result.stdout + result.stderr
    ids = re.findall(r"^(file_[0-9a-f]{24})  (\S+)", result.stdout, flags=re.M)
    assert [name for _, name in ids] == ["train.jsonl", "eval.jsonl"]
    assert f"source: {ids[0][0]}" in result.stdout
