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
