"""trainer.model.resolve_attn: `auto` picks flash attention only where it can run."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainer.model import resolve_attn


@pytest.fixture
def flash_attn_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A `flash_attn` package on sys.path whose import runs the __init__.py a test writes."""
    package = tmp_path / "flash_attn"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    yield package
    sys.modules.pop("flash_attn", None)


@pytest.mark.parametrize(
    "failure",
    [
        # What a wheel built against another torch raises: the extension's undefined symbol.
        "raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi')",
        "raise OSError('libcudart.so.12: cannot open shared object file')",
        "raise RuntimeError('FlashAttention only supports Ampere GPUs or newer.')",
    ],
)
def test_auto_falls_back_to_sdpa_when_flash_attn_is_installed_but_broken(
    flash_attn_package: Path, failure: str
) -> None:
    (flash_attn_package / "__init__.py").write_text(failure + "\n")
    assert resolve_attn("auto", "cuda", "bf16") == "sdpa"


def test_auto_uses_flash_attn_only_on_cuda_in_a_half_dtype(flash_attn_package: Path) -> None:
    assert resolve_attn("auto", "cuda", "bf16") == "flash_attention_2"
    assert resolve_attn("auto", "cuda", "fp16") == "flash_attention_2"
    # No float32 kernels: a `mixed_precision: no` job gets sdpa.
    assert resolve_attn("auto", "cuda", "no") == "sdpa"
    assert resolve_attn("auto", "cpu", "bf16") == "sdpa"
    # An explicit choice is kept (the spec already refused the combinations that cannot run).
    assert resolve_attn("eager", "cuda", "bf16") == "eager"


def test_auto_takes_fa3_on_hopper_where_fa3_or_kernels_imports(
    flash_attn_package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer import model

    monkeypatch.setattr(model, "cuda_capability_major", lambda: 9)
    monkeypatch.setattr(model, "module_importable", lambda name: name in ("kernels", "flash_attn"))
    assert model.choose_attn("auto", "cuda", "bf16") == model.AttnChoice("flash_attention_3")
    monkeypatch.setattr(model, "module_importable", lambda name: name == "flash_attn")
    assert model.choose_attn("auto", "cuda", "bf16") == model.AttnChoice("flash_attention_2")
    # Ampere: FA2, whatever FA3 packages are there.
    monkeypatch.setattr(model, "cuda_capability_major", lambda: 8)
    monkeypatch.setattr(model, "module_importable", lambda name: True)
    assert model.choose_attn("auto", "cuda", "bf16").name == "flash_attention_2"


def test_a_fallback_to_sdpa_says_why_and_what_packing_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer import model

    monkeypatch.setattr(model, "cuda_capability_major", lambda: 9)
    monkeypatch.setattr(model, "module_importable", lambda name: False)
    choice = model.choose_attn("auto", "cuda", "bf16", packing=True)
    assert choice.name == "sdpa" and choice.fallback is not None
    assert "flash-attn is not installed" in choice.fallback and "FA3" in choice.fallback
    assert "block-diagonal mask" in choice.fallback
    assert "packing" not in (model.choose_attn("auto", "cuda", "bf16").fallback or "")
    # Nothing faster could run on the CPU or in float32, and an explicit sdpa is what was asked: no warning.
    assert model.choose_attn("auto", "cpu", "bf16") == model.AttnChoice("sdpa")
    assert model.choose_attn("auto", "cuda", "no") == model.AttnChoice("sdpa")
    assert model.choose_attn("sdpa", "cuda", "bf16") == model.AttnChoice("sdpa")


def test_the_fallback_is_a_job_warning_written_once_by_rank_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from trainer import train

    monkeypatch.setenv("RANK", "1")
    train.attention_fell_back("falls back to sdpa", tmp_path)
    assert not (tmp_path / "warnings.jsonl").exists()
    monkeypatch.setenv("RANK", "0")
    train.attention_fell_back("falls back to sdpa", tmp_path)
    (line,) = (tmp_path / "warnings.jsonl").read_text().splitlines()
    assert json.loads(line)["kind"] == "attention_fallback"
    assert json.loads(line)["message"] == "falls back to sdpa"
