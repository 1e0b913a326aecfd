"""trainer/hub.py through the real entry point: a hub id that is not cached, with the Hub unreachable, is
one ftq-error line from a single look, not a minute of huggingface_hub's retries. "Unreachable" stays on
loopback: an endpoint on a closed port, or a proxy on one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import REPO, free_port
from tests.integration.trainer.helpers import explain, trainer_env, write_spec


@pytest.mark.parametrize(
    ("section", "code", "via_proxy"),
    [("model", "model_error", False), ("model", "model_error", True), ("dataset", "dataset_error", False)],
    ids=["model-closed-endpoint", "model-dead-proxy", "dataset-closed-endpoint"],
)
def test_an_unreachable_hub_fails_at_once_naming_the_fix(
    tiny_dir: Path, tmp_path: Path, section: str, code: str, via_proxy: bool
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    env = trainer_env()
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "NO_PROXY", "no_proxy"):
        env.pop(name, None)
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty cache: nothing to fall back on
    if via_proxy:
        # The endpoint's name is never resolved: every request goes to the (dead) proxy.
        env.update(HF_ENDPOINT="http://hub.example.invalid", HTTP_PROXY=closed, http_proxy=closed)
        endpoint = "http://hub.example.invalid"
    else:
        env["HF_ENDPOINT"] = endpoint = closed
    spec: dict[str, dict[str, object]] = {
        "model": {"name_or_path": str(tiny_dir / "model")},
        "dataset": {"name_or_path": str(tiny_dir / "data" / "train.jsonl"), "text_field": "text"},
        "training": {"max_seq_len": 64, "max_steps": 2, "mixed_precision": "no"},
        "resources": {"device": "cpu"},
    }
    hub_id = f"someone/not-cached-{section}"
    spec[section] = {**spec[section], "name_or_path": hub_id}
    spec_file = write_spec(tmp_path / "spec.json", spec)
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--spec", str(spec_file), "--output_dir", str(tmp_path / "out")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, explain(proc)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("ftq-error: ")]
    assert len(lines) == 1, explain(proc)
    assert lines[0].startswith(f"ftq-error: {code}: cannot reach the Hugging Face Hub at {endpoint}")
    assert hub_id in lines[0] and "use a local path" in lines[0]
    # The one look replaced huggingface_hub's backoff, which logs each of its retries.
    assert "Retrying in" not in proc.stderr, explain(proc)
