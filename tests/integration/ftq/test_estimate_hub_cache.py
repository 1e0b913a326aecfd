"""The memory estimate reads a hub model's config.json from the local Hugging Face cache only, offline: in a
fresh interpreter, since the hub library reads HF_HUB_CACHE when it is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.harness import MODEL_CONFIGS, REPO

FALCON = "falcon-180B"


def test_load_model_config_from_the_hub_cache_only(tmp_path: Path) -> None:
    """A hub id is looked up in the local cache, offline; absent, the estimate is skipped with a reason."""
    snapshot = tmp_path / "hub" / "models--tiiuae--falcon-180B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((MODEL_CONFIGS / FALCON / "config.json").read_text())
    (tmp_path / "hub" / "models--tiiuae--falcon-180B" / "refs").mkdir()
    (tmp_path / "hub" / "models--tiiuae--falcon-180B" / "refs" / "main").write_text("abc123")
    code = (
        "import json; from ftq.planning.estimate import load_model_config as f\n"
        "print(json.dumps([f('tiiuae/falcon-180B')[0]['num_kv_heads'], f('meta-llama/Llama-2-70b-hf')]))"
    )
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    kv, missing = json.loads(out.stdout)
    assert kv == 8
    assert missing == [None, "config for meta-llama/Llama-2-70b-hf is not on this machine; estimate skipped"]
