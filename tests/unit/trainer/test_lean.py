"""Which optional packages a run leaves out of its start-up (trainer/lean.py): only what its spec cannot
need, and left out for real, as transformers and PEFT see it."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ftq.contract.spec import JobSpec
from tests.harness import REPO
from trainer.lean import (
    OPTIONAL,
    _cached_define_import_structure,
    _cached_packages_distributions,
    imports_without_gc,
    unused,
)


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


def test_left_out_packages_are_absent_to_transformers_and_peft(tiny_dir: Path, tmp_path: Path) -> None:
    # In a fresh interpreter: this one may have imported them already.
    code = f"""
import json
from ftq.contract.spec import JobSpec
from trainer.lean import start_up
spec = JobSpec.model_validate({{"model": {{"name_or_path": {str(tiny_dir / "model")!r}}},
                                "dataset": {{"name_or_path": "x.jsonl"}}, "training": {{"max_steps": 1}},
                                "lora": {{"r": 4}}}})
import gc, importlib.metadata, sys
from pathlib import Path
from trainer.lean import _cached_define_import_structure
with start_up(spec) as skipped:
    import transformers.models.llama.modeling_llama
frozen = gc.get_freeze_count()
gc.unfreeze()
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
# The scans, served from the files this start wrote, give what the scans themselves give.
import transformers.utils.import_utils as iu
models = Path(iu.__file__).parent.parent / "models"
upstream = iu.define_import_structure.__wrapped__  # transformers' own, behind its lru_cache
served = _cached_define_import_structure(upstream, transformers.__version__)
# A fresh scan: transformers' __init__ extended the answers its caches hold.
iu.create_import_structure_from_path.cache_clear()
structure_equal = served(models, prefix="models") == upstream.__wrapped__(models, "models")
pd = importlib.metadata.packages_distributions
distributions_equal = pd() == pd.__wrapped__()
print(json.dumps({{"skipped": skipped, "bnb": bnb, "loaded": loaded, "available": available,
                  "equal": [structure_equal, distributions_equal], "frozen": frozen > 100_000,
                  "gc": gc.isenabled()}}))
"""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {
        "skipped": list(OPTIONAL),
        "bnb": "absent",
        "loaded": [],
        "available": [False] * 5,
        "equal": [True, True],
        "frozen": True,  # what the imports made is frozen, and the collector is back on after them
        "gc": True,
    }
    written = sorted(p.name.split("-")[0] for p in (tmp_path / "ftq" / "start-up").iterdir())
    assert "distributions" in written and written.count("transformers") >= 2  # models/, and llama/


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache home ($XDG_CACHE_HOME) for this test alone."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_scan_is_served_until_a_file_it_read_changes(
    tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "models"
    (tree / "llama").mkdir(parents=True)
    module = tree / "llama" / "modeling_llama.py"
    module.write_text('__all__ = ["LlamaModel"]\n')
    scans: list[str] = []

    def scan(path: Any, prefix: str | None = None) -> Any:
        scans.append(str(path))
        names = module.read_text().split('"')[1::2]
        return {frozenset({"torch"}): {f"{prefix}.llama.modeling_llama": set(names)}}

    def served() -> Any:  # a new process's function: nothing held in memory
        return _cached_define_import_structure(scan, "5.0")(tree, prefix="models")

    assert served() == {frozenset({"torch"}): {"models.llama.modeling_llama": {"LlamaModel"}}}
    assert served() == {frozenset({"torch"}): {"models.llama.modeling_llama": {"LlamaModel"}}}
    assert len(scans) == 1
    module.write_text('__all__ = ["LlamaModel", "LlamaForCausalLM"]\n')
    both = {frozenset({"torch"}): {"models.llama.modeling_llama": {"LlamaModel", "LlamaForCausalLM"}}}
    assert served() == both
    assert len(scans) == 2
    # Another transformers version scans again.
    _cached_define_import_structure(scan, "5.1")(tree, prefix="models")
    assert len(scans) == 3

    # A damaged cache file is scanned over and rewritten; an unwritable cache still answers.
    for cached in (cache_home / "ftq" / "start-up").iterdir():
        cached.write_text("{not json")
    assert served() == both
    assert len(scans) == 4
    (tmp_path / "blocked").write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "blocked"))
    assert served() == both
    assert len(scans) == 5


@pytest.mark.usefixtures("cache_home")
def test_the_distributions_scan_is_served_until_one_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site-packages"
    (site / "torch-2.13.0.dist-info").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(site), str(tmp_path / "missing")])
    scans: list[int] = []

    def scan() -> dict[str, list[str]]:
        scans.append(1)
        return {"torch": ["torch"]}

    served = _cached_packages_distributions(scan)
    assert served() == served() == {"torch": ["torch"]}
    assert len(scans) == 1
    (site / "notes.txt").write_text("a file that is no distribution: the working directory's churn")
    served()
    assert len(scans) == 1
    (site / "peft-0.18.0.dist-info").mkdir()
    served()
    assert len(scans) == 2


def test_the_collector_is_off_only_while_importing() -> None:
    assert gc.isenabled()
    before = gc.get_freeze_count()
    try:
        with imports_without_gc():
            assert not gc.isenabled()
            made: list[list[int]] = [[] for _ in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= before + len(made)
        # A caller that had it off keeps it off.
        gc.disable()
        with imports_without_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
