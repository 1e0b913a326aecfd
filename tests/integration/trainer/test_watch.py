"""A run whose loss is NaN, for real: two DDP processes on a copy of the tiny model with one weight set to
infinity. Both ranks stop at the first logged step, nothing is saved (no checkpoint of NaN weights, no
final model), the run ends with `ftq-error: diverged`, which the worker's failure classifier reads as
the `diverged` error code, and warnings.jsonl holds the nan_loss warning that becomes a job.warning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ftq.contract import runs
from ftq.contract.errors import ErrorCode
from tests.harness import tiny_spec
from tests.integration.trainer.helpers import explain, launch_spec
from worker import failures

pytestmark = pytest.mark.slow


def test_a_nan_loss_stops_every_rank_without_saving(tiny_dir: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(tiny_dir / "model", model)
    weights = load_file(str(model / "model.safetensors"))
    name = next(k for k in weights if "layers.0.mlp.down_proj" in k)
    weights[name] = torch.full_like(weights[name], float("inf"))
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})

    spec = tiny_spec(tiny_dir, max_steps=4, save_steps=1, processes=2)
    spec["model"]["name_or_path"] = str(model)
    out = tmp_path / "run"
    proc = launch_spec(spec, tmp_path)
    assert proc.returncode != 0, explain(proc)
    assert "ftq-error: diverged: " in proc.stderr, explain(proc)
    failure = failures.classify(exit_code=proc.returncode, log_tail=proc.stderr)
    assert failure.code == ErrorCode.diverged and "no checkpoint was saved" in failure.message

    warnings = [json.loads(line) for line in (out / runs.WARNINGS).read_text().splitlines()]
    assert [w["kind"] for w in warnings] == ["nan_loss"] and warnings[0]["step"] == 1  # rank 0 alone wrote
    assert runs.list_checkpoints(out) == []
    assert not (out / runs.FINAL).exists()
