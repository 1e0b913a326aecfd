"""trainer.export's fast paths, in process: the request it reads, and the Hub errors that must come in
seconds and before any merge (no token; an endpoint where nothing listens). No network is used."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ftq.contract.errors import ErrorCode
from tests.harness import free_port
from trainer import export as exp


def test_no_token_is_a_hub_error_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(exp.HubError) as caught:
        exp.hub_token()
    assert caught.value.code == ErrorCode.hub_error
    assert "FTQ_HUB_TOKEN" in caught.value.line()


def test_an_unreachable_hub_fails_in_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    started = time.monotonic()
    with pytest.raises(exp.HubError) as caught:
        exp.check_hub("hf_x")
    assert "cannot reach the Hugging Face Hub" in caught.value.message
    assert time.monotonic() - started < exp.PROBE_TIMEOUT_S + 5  # one probe, no retries with backoff
    assert caught.value.line().startswith("ftq-error: hub_error: ")


def test_push_fails_before_anything_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "final" / "adapter_config.json").write_text("{}")
    (run / "spec.json").write_text(
        json.dumps(
            {
                "model": {"name_or_path": "/m"},
                "dataset": {"name_or_path": "/d.jsonl"},
                "training": {"max_steps": 1},
            }
        )
    )
    out = run / "exports" / "exp_1"
    request = {
        "export_id": "exp_1", "job_id": "job_1", "kind": "merged", "dtype": "bf16", "max_shard_size": "5GB",
        "push_to_hub": {"repo_id": "a/b", "private": True}, "run_dir": str(run), "out_dir": str(out),
    }  # fmt: skip
    (tmp_path / "export.json").write_text(json.dumps(request))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(SystemExit) as ended:
        exp.main(["--request", str(tmp_path / "export.json")])
    assert ended.value.code == 2
    assert not out.exists()


def test_the_request_reads_push_to_hub_as_a_typed_target(tmp_path: Path) -> None:
    base = {
        "export_id": "exp_1", "job_id": "job_1", "kind": "merged", "dtype": "bf16", "max_shard_size": "5GB",
        "run_dir": str(tmp_path), "out_dir": str(tmp_path / "out"),
    }  # fmt: skip
    path = tmp_path / "export.json"
    path.write_text(json.dumps({**base, "push_to_hub": {"repo_id": "org/m", "private": False}}))
    assert exp.ExportRequest.read(path).push_to_hub == exp.HubTarget("org/m", private=False)
    path.write_text(json.dumps({**base, "push_to_hub": None}))
    assert exp.ExportRequest.read(path).push_to_hub is None
