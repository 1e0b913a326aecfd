"""ftq.engine without a server: the LoRA slot sizes, the server's command line and environment, and the
errors that come before any process (no venv: the one command that installs it; an adapter above the
engine's rank)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from ftq.engine import (
    INSTALL_COMMAND,
    Engine,
    EngineConfig,
    EngineError,
    EngineNotInstalled,
    LocalEngine,
    adapter_rank,
    lora_rank_slot,
)


@pytest.mark.parametrize(
    ("ranks", "slot"), [((1,), 1), ((4,), 8), ((8,), 8), ((16, 9), 16), ((64,), 64), ((300,), 320)]
)
def test_the_lora_slot_is_the_smallest_vllm_rank_that_holds_every_adapter(
    ranks: tuple[int, ...], slot: int
) -> None:
    assert lora_rank_slot(*ranks) == slot


def test_a_rank_past_vllms_highest_is_refused() -> None:
    with pytest.raises(EngineError, match="above 512"):
        lora_rank_slot(1024)
    with pytest.raises(EngineError):
        EngineConfig(model=Path("m"), max_lora_rank=4096)


def _adapter(path: Path, r: int, pattern: dict[str, int] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": r, "rank_pattern": pattern or {}}))
    return path


def test_an_adapters_rank_is_its_highest(tmp_path: Path) -> None:
    assert adapter_rank(_adapter(tmp_path / "a", 8)) == 8
    assert adapter_rank(_adapter(tmp_path / "b", 8, {"q_proj": 32})) == 32
    with pytest.raises(EngineError, match=r"no adapter_config\.json"):
        adapter_rank(tmp_path / "missing")


def test_the_server_runs_from_its_venv_with_dynamic_lora_in_float32_on_the_cpu(tmp_path: Path) -> None:
    engine = LocalEngine(EngineConfig(model=tmp_path / "model", name="ftq-tiny-serve", max_lora_rank=10))
    assert isinstance(engine, Engine)
    args = engine.arguments()
    flags = dict(itertools.pairwise(args))  # each flag and the word after it
    assert args[:2] == ["-m", "vllm.entrypoints.launchers.api_server.entry"]
    assert flags["--model"] == str((tmp_path / "model").resolve())
    assert flags["--served-model-name"] == "ftq-tiny-serve"
    assert flags["--host"] == "127.0.0.1"
    assert flags["--dtype"] == "float32"
    assert flags["--max-lora-rank"] == "16"  # 10 rounded up to a rank vLLM sizes for
    assert flags["--max-loras"] == "4"
    assert "--enable-lora" in args
    assert flags["--kv-cache-memory-bytes"] == str(256 * 2**20)
    env = engine.environment()
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert "PYTHONPATH" not in env
    # Its own key, the one its callers send; vLLM then answers nothing under /v1 without it.
    assert env["VLLM_API_KEY"] and engine.headers == {"Authorization": f"Bearer {env['VLLM_API_KEY']}"}
    assert "--api-key" not in args  # not on the command line, which /proc shows to every user


def test_the_engine_gets_none_of_the_services_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine reads files the tenants' runs wrote (adapters, a full fine-tune's folder): it gets an
    allowlist of the API's environment, never ftq's settings or a credential."""
    for name, value in {
        "FTQ_API_TOKENS": "tok:alice",
        "FTQ_DATABASE_URL": "postgresql://u:pw@db/ftq",
        "HF_TOKEN": "hf_x",
        "MLFLOW_TRACKING_PASSWORD": "pw",
        "AWS_SECRET_ACCESS_KEY": "k",
        "MY_SETTING": "x",
        "OMP_NUM_THREADS": "2",
        "HF_HOME": "/srv/hf",
        "CUDA_VISIBLE_DEVICES": "0",
    }.items():
        monkeypatch.setenv(name, value)
    env = LocalEngine(EngineConfig(model=tmp_path)).environment()
    for gone in ("FTQ_API_TOKENS", "FTQ_DATABASE_URL", "HF_TOKEN", "MLFLOW_TRACKING_PASSWORD",
                 "AWS_SECRET_ACCESS_KEY", "MY_SETTING"):  # fmt: skip
        assert gone not in env
    assert (
        env["OMP_NUM_THREADS"] == "2" and env["HF_HOME"] == "/srv/hf" and env["CUDA_VISIBLE_DEVICES"] == "0"
    )
    assert env["PATH"]


def test_a_gpu_engine_takes_vllms_dtype_and_its_tensor_parallel_size(tmp_path: Path) -> None:
    config = EngineConfig(model=tmp_path, device="cuda", tensor_parallel=2)
    args = LocalEngine(config).arguments()
    assert args[args.index("--dtype") + 1] == "auto"
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert "--kv-cache-memory-bytes" not in args
    with pytest.raises(ValueError, match="needs device cuda"):
        EngineConfig(model=tmp_path, tensor_parallel=2)


def test_without_the_venv_the_error_names_the_command_that_installs_it(tmp_path: Path) -> None:
    engine = LocalEngine(EngineConfig(model=tmp_path), venv=tmp_path / "no-venv")
    with pytest.raises(EngineNotInstalled) as caught:
        engine.start()
    assert INSTALL_COMMAND == "make vllm"
    assert "`make vllm` installs it" in str(caught.value)
    assert engine.pid is None


def test_the_venv_may_be_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTQ_VLLM_VENV", str(tmp_path / "elsewhere"))
    assert LocalEngine(EngineConfig(model=tmp_path)).venv == tmp_path / "elsewhere"


def test_an_adapter_above_the_engines_rank_is_refused_before_the_server_is_asked(tmp_path: Path) -> None:
    engine = LocalEngine(EngineConfig(model=tmp_path, max_lora_rank=16))
    with pytest.raises(EngineError, match="rank 32, above this engine's max_lora_rank 16"):
        engine.load_adapter("big", _adapter(tmp_path / "big", 32))
