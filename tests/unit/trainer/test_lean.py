"""Which optional packages a run leaves out of its start-up (trainer/lean.py): only what its spec cannot
need, and left out for real, as transformers and PEFT see it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from ftq.contract.spec import JobSpec
from tests.harness import REPO
from trainer.lean import OPTIONAL, unused


def spec(model: Path, **parts: Any) -> JobSpec:
    body: dict[str, Any] = {
        "model": {"name_or_path": str(model)},
        "dataset": {"name_or_path": "x.jsonl"},
        "training": {"max_steps": 1},
        "resources": {"device": "cpu"},
        **parts,
    }
    return JobSpec.model_validate(body)


def test_a_plain_lora_run_needs_none_of_them(tiny_dir: Path) -> None:
    assert unused(spec(tiny_dir / "model", lora={"r": 4})) == list(OPTIONAL)


def test_each_setting_keeps_the_package_it_needs(tiny_dir: Path, tmp_path: Path) -> None:
    model = tiny_dir / "model"
    quantized = {"r": 4, "quantization": {"bits": 4}}
    assert "bitsandbytes" not in unused(spec(model, lora=quantized))
    assert "deepspeed" not in unused(spec(model, distributed={"strategy": "deepspeed"}))
    integrations = {"wandb": {"project": "p"}, "mlflow": {"experiment": "e"}}
    assert unused(spec(model, integrations=integrations)) == ["bitsandbytes", "deepspeed", "scipy"]
    # A side run (an export, an evaluation) of that job logs to no tracker, and may run lm-eval's metrics.
    side = unused(spec(model, integrations=integrations), side_run=True)
    assert side == ["bitsandbytes", "deepspeed", "wandb", "mlflow"]

    # A model folder whose weights are already quantized, and a hub id (its config is not read here).
    prequantized = tmp_path / "prequantized"
    prequantized.mkdir()
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (prequantized / "config.json").write_text(json.dumps(config))
    assert "bitsandbytes" not in unused(spec(prequantized))
    assert "bitsandbytes" not in unused(spec(Path("some-org/some-model")))


def test_left_out_packages_are_absent_to_transformers_and_peft(tiny_dir: Path) -> None:
    # In a fresh interpreter: this one may have imported them already.
    code = f"""
import json
from ftq.contract.spec import JobSpec
from trainer.lean import skip_unused_imports
spec = JobSpec.model_validate({{"model": {{"name_or_path": {str(tiny_dir / "model")!r}}},
                                "dataset": {{"name_or_path": "x.jsonl"}}, "training": {{"max_steps": 1}},
                                "lora": {{"r": 4}}}})
skipped = skip_unused_imports(spec)
import sys
from transformers.utils import is_bitsandbytes_available, is_scipy_available
from transformers.integrations import is_mlflow_available, is_wandb_available
from accelerate.utils import is_deepspeed_available
import peft
try:
    import bitsandbytes
    bnb = "imported"
except ImportError:
    bnb = "absent"
checks = (is_bitsandbytes_available, is_mlflow_available, is_wandb_available, is_deepspeed_available,
          is_scipy_available)
loaded = sorted(m for m in {list(OPTIONAL)!r} if sys.modules.get(m))
available = [bool(f()) for f in checks]
print(json.dumps({{"skipped": skipped, "bnb": bnb, "loaded": loaded, "available": available}}))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"skipped": list(OPTIONAL), "bnb": "absent", "loaded": [], "available": [False] * 5}
