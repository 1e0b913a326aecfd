"""The dataset preflight on a real `ftq up`: a dry run (and the stored plan of a submitted job) carries
`plan.dataset` with rows, tokens per sample, truncation, total tokens and steps per epoch, for an
upload and for a local file; the numbers are checked against the tokenizer itself."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from tests.e2e.files.conftest import ALICE
from tests.e2e.files.helpers import upload_raw, wait_validated
from tests.harness import Deployment, run_ftq, tiny_spec

MAX_SEQ_LEN = 16


def _expected(tiny: Path) -> dict[str, Any]:
    tok = Tokenizer.from_file(str(tiny / "model" / "tokenizer.json"))
    rows = [
        json.loads(line) for line in (tiny / "data" / "train.jsonl").read_text().splitlines() if line.strip()
    ]
    lengths = sorted(len(tok.encode(r["text"]).ids) for r in rows)
    return {
        "rows": len(rows),
        "min": lengths[0],
        "max": lengths[-1],
        "median": lengths[math.ceil(0.5 * len(lengths)) - 1],
        "p95": lengths[math.ceil(0.95 * len(lengths)) - 1],
        "total": sum(lengths),
        "trained": sum(min(n, MAX_SEQ_LEN) for n in lengths),
        "truncated": sum(1 for n in lengths if n > MAX_SEQ_LEN),
    }


def _check(dataset: dict[str, Any], want: dict[str, Any], *, batch: int, accumulation: int) -> None:
    assert dataset["rows"] == want["rows"] and dataset["rows_exact"] is True
    assert dataset["sampled"] is False
    stats = dataset["tokens_per_sample"]
    assert (stats["min"], stats["median"], stats["p95"], stats["max"]) == (
        want["min"],
        want["median"],
        want["p95"],
        want["max"],
    )
    assert dataset["total_tokens"] == want["total"]
    assert dataset["train_tokens_per_epoch"] == want["trained"]
    assert dataset["truncated_samples"] == want["truncated"] > 0
    assert dataset["effective_batch_size"] == batch * accumulation
    assert dataset["steps_per_epoch"] == math.ceil(want["rows"] / (batch * accumulation))
    # The plan's one time estimate, resting on the tokens the preflight counted.
    estimate = dataset["time_estimate"]
    assert estimate["tokens"] == dataset["run_tokens"] is not None
    assert estimate["seconds"] is not None and estimate["reason"] is None


def test_dry_run_of_an_upload_shows_its_token_statistics(files_server: Deployment, tiny: Path) -> None:
    want = _expected(tiny)
    data = (tiny / "data" / "train.jsonl").read_bytes()
    f = wait_validated(files_server, ALICE, upload_raw(files_server, ALICE, data).json()["id"])
    spec = tiny_spec(
        tiny, max_seq_len=MAX_SEQ_LEN, per_device_train_batch_size=2, gradient_accumulation_steps=3
    )
    spec["dataset"] = {"file_id": f["id"]}
    with files_server.client(ALICE) as c:
        r = c.post("/jobs", params={"dry_run": "true"}, json=spec)
    assert r.status_code == 200, r.text
    dataset = r.json()["dataset"]
    assert dataset["source"] == f["id"]
    assert dataset["tokenizer"] == str(tiny / "model")
    _check(dataset, want, batch=2, accumulation=3)


def test_a_local_file_gets_the_same_numbers_and_submit_stores_them(
    files_server: Deployment, tiny: Path
) -> None:
    want = _expected(tiny)
    spec = tiny_spec(tiny, max_seq_len=MAX_SEQ_LEN, per_device_train_batch_size=2, max_steps=1)
    with files_server.client(ALICE) as c:
        r = c.post("/jobs", params={"dry_run": "true"}, json=spec)
        assert r.status_code == 200, r.text
        _check(r.json()["dataset"], want, batch=2, accumulation=1)
        assert r.json()["time_estimate"] == r.json()["dataset"]["time_estimate"]
        job = c.post("/jobs", json=spec).json()
        plan = c.get(f"/jobs/{job['id']}/plan").json()
        c.post(f"/jobs/{job['id']}/cancel")
    _check(plan["dataset"], want, batch=2, accumulation=1)


def test_large_files_are_sampled_and_say_so(files_server: Deployment, tiny: Path, tmp_path: Path) -> None:
    rows = [json.dumps({"text": f"sample number {i} of many"}) for i in range(5000)]
    path = files_server.data_dir / "many.jsonl"
    path.write_text("\n".join(rows) + "\n")
    spec = tiny_spec(tiny, max_seq_len=MAX_SEQ_LEN)
    spec["dataset"] = {"name_or_path": str(path), "text_field": "text"}
    with files_server.client(ALICE) as c:
        r = c.post("/jobs", params={"dry_run": "true"}, json=spec)
    assert r.status_code == 200, r.text
    d = r.json()["dataset"]
    assert d["sampled"] is True and d["sample_rows"] == 2000 and d["rows_exact"] is False
    assert 4500 < d["rows"] < 5500


def test_a_hub_model_skips_the_token_statistics_and_says_why(files_server: Deployment, tiny: Path) -> None:
    spec = tiny_spec(tiny)
    spec["model"] = {"name_or_path": "meta-llama/Llama-2-7b-hf"}
    with files_server.client(ALICE) as c:
        r = c.post("/jobs", params={"dry_run": "true"}, json=spec)
    assert r.status_code == 200, r.text
    d = r.json()["dataset"]
    assert d["tokens_per_sample"] is None
    assert "Hub" in d["skipped"]
    assert d["rows"] == _expected(tiny)["rows"]


def test_cli_dry_run_prints_the_dataset_section(files_server: Deployment, tiny: Path, tmp_path: Path) -> None:
    spec = tiny_spec(tiny, max_seq_len=MAX_SEQ_LEN)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    result = run_ftq("submit", str(spec_file), "--dry-run", url=files_server.url, token=ALICE)
    assert result.returncode == 0, result.stderr
    want = _expected(tiny)
    assert f"tokens per sample: min {want['min']}" in result.stdout
    assert f"total tokens: {want['total']}" in result.stdout
