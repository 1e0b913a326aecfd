"""FSDP where host memory shows: a ~136M-parameter random Llama saved in bf16, two CPU ranks.

With the tiny model every rank could read all weights and rank 0 could gather everything without a
trace; at 70B that is 2.2 TB of host RAM per node when loading and 276 GB on rank 0 for a LoRA job's
final save. Each rank logs how far a phase raised its peak RSS (VmHWM, reset when the phase begins),
and these tests read those lines from the real `accelerate launch` runs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.trainer.helpers import (
    explain,
    launch_spec,
    points,
    rendered_config,
    run_trainer,
    write_spec,
)

pytestmark = pytest.mark.slow

PEAK = re.compile(r"rank (\d) (loading|final save)[^:]*: peak RSS \+(\d+) MiB")
MIB = 2**20


def build_mid_model(folder: Path, tokenizer_from: Path) -> int:
    """A random Llama of ~136M parameters (tied embeddings, GQA) in bf16; returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=12,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=448,  # the tiny tokenizer's
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config)
    model.bfloat16()  # stored as released checkpoints are; loaded in float32 under FSDP
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tokenizer_from / name, folder / name)
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def mid(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mid")
    n_params = build_mid_model(root / "model", tiny_dir / "model")
    # Identical rows: the first step's loss is then the same however the rows are split among ranks.
    row = json.dumps({"text": "one two three four five six seven eight nine ten " * 3})
    (root / "data.jsonl").write_text((row + "\n") * 32)
    spec = {
        "model": {"name_or_path": str(root / "model")},
        "dataset": {"name_or_path": str(root / "data.jsonl")},
        "training": {
            "max_seq_len": 32,
            "max_steps": 1,
            "per_device_train_batch_size": 1,
            "learning_rate": 1e-3,
            "logging_steps": 1,
            "packing": False,
            "gradient_checkpointing": False,
            "mixed_precision": "no",
            "seed": 1,
        },
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "resources": {"device": "cpu"},
    }
    return {"root": root, "spec": spec, "n_params": n_params}


def peaks(stderr: str) -> dict[tuple[int, str], int]:
    """(rank, phase) -> MiB by which the phase raised that rank's peak RSS."""
    return {(int(r), phase): int(mib) for r, phase, mib in PEAK.findall(stderr)}


@pytest.fixture(scope="module")
def one_process_loss(mid: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> float:
    work = tmp_path_factory.mktemp("one")
    spec = {**mid["spec"], "distributed": {"strategy": "none"}}
    proc = run_trainer(
        ["--spec", str(write_spec(work / "spec.json", spec)), "--output_dir", str(work / "run")]
    )
    assert proc.returncode == 0, explain(proc)
    loss: float = points(work / "run")[0]["loss"]
    return loss


@pytest.fixture(scope="module", params=[2, 1], ids=["fsdp2", "fsdp1"])
def fsdp_run(
    request: pytest.FixtureRequest, mid: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, subprocess.CompletedProcess[str], Path]:
    version: int = request.param
    work = tmp_path_factory.mktemp(f"fsdp{version}")
    spec = {
        **mid["spec"],
        "distributed": {"strategy": "fsdp", "fsdp": {"version": version}},
        "resources": {"device": "cpu", "processes_per_node": 2},
    }
    # The config ftq renders: RAM-efficient loading (and FSDP1's sync_module_states) as a job gets them.
    config = rendered_config(spec)
    assert "fsdp_cpu_ram_efficient_loading: true" in config
    proc = launch_spec(spec, work, config)
    assert proc.returncode == 0, explain(proc)
    assert "engaged fsdp" in proc.stderr  # sharded for real, not accelerate's DDP fallback on CPU
    return version, proc, work / "run"


def test_only_rank_0_reads_the_weights_and_the_first_step_matches_one_process(
    fsdp_run: tuple[int, subprocess.CompletedProcess[str], Path], mid: dict[str, Any], one_process_loss: float
) -> None:
    _, proc, out = fsdp_run
    grew = peaks(proc.stderr)
    # Rank 0 reads the bf16 file and holds the model in float32 (FSDP's load dtype): ~800 MiB here.
    assert grew[(0, "loading")] * MIB > mid["n_params"] * 4 * 0.8, grew
    assert grew[(1, "loading")] < grew[(0, "loading")] / 5, grew
    # Rank 1 trained on rank 0's weights and its own rotary buffers: the same loss as one process.
    assert points(out)[0]["loss"] == pytest.approx(one_process_loss, rel=1e-5)


def test_lora_final_save_gathers_only_the_adapter(
    fsdp_run: tuple[int, subprocess.CompletedProcess[str], Path], mid: dict[str, Any]
) -> None:
    _, proc, out = fsdp_run
    adapter = out / "final" / "adapter_model.safetensors"
    adapter_mib = adapter.stat().st_size / MIB  # ~1.3 MiB; the base in float32 would be ~520 MiB
    assert peaks(proc.stderr)[(0, "final save")] < adapter_mib + 32, (adapter_mib, peaks(proc.stderr))

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(mid["root"] / "model", dtype=torch.float32)
    model = PeftModel.from_pretrained(base, out / "final")
    lora_b = [v for k, v in model.state_dict().items() if "lora_B" in k]
    assert len(lora_b) == 24 and all(float(t.abs().sum()) > 0 for t in lora_b)  # trained, not zero init
    tok: Any = AutoTokenizer.from_pretrained(out / "final")
    inputs = tok("one two three", return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert generated.shape[1] == inputs["input_ids"].shape[1] + 3


def test_fsdp1_full_fine_tune_on_cpu_saves_a_model_that_loads(tiny_dir: Path, tmp_path: Path) -> None:
    """FSDP1 on CPU (sync_module_states over gloo) gathers a full model for final/ without crashing."""
    spec = {
        "model": {"name_or_path": str(tiny_dir / "model")},
        "dataset": {"name_or_path": str(tiny_dir / "data" / "train.jsonl")},
        "training": {
            "max_seq_len": 64,
            "max_steps": 2,
            "logging_steps": 1,
            "learning_rate": 1e-3,
            "mixed_precision": "no",
        },
        "distributed": {"strategy": "fsdp", "fsdp": {"version": 1}},
        "resources": {"device": "cpu", "processes_per_node": 2},
    }
    # The config ftq renders for this spec: a CPU rehearsal of FSDP1 loads as the GPU job would.
    rendered = rendered_config(spec)
    assert "fsdp_sync_module_states: true" in rendered and "fsdp_cpu_ram_efficient_loading: true" in rendered
    proc = launch_spec(spec, tmp_path, rendered)
    assert proc.returncode == 0, explain(proc)
    assert "engaged fsdp" in proc.stderr
    assert [p["step"] for p in points(tmp_path / "run") if p["loss"] is not None] == [1, 2]

    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    saved = load_file(tmp_path / "run" / "final" / "model.safetensors")
    base = load_file(tiny_dir / "model" / "model.safetensors")
    assert saved.keys() == base.keys()
    assert any(not torch.equal(saved[k], base[k]) for k in base)  # trained weights, every tensor present
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final")
    out = model.generate(input_ids=torch.tensor([[1, 5, 6]]), max_new_tokens=3, do_sample=False)
    assert out.shape[1] == 6
