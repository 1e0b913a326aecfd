"""The GPUs an evaluation of a cuda job asks the scheduler for (worker.evaluations.evaluation_gpus, issue
49): as many of one node as ftq.planning.serving.engine_size says its base needs in the evaluation's dtype
(bfloat16; a QLoRA base in 4 bits), one for a CPU job or a model whose config is not on this machine; and
its SLURM script asks for as many (`--gres=gpu:N`)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ftq.contract.spec import JobSpec
from ftq.planning.render import render_export_plan
from ftq.runtime.settings import Settings
from tests.harness import MODEL_CONFIGS
from worker import evaluations, scheduling

GIB = 2**30
H100 = 80 * GIB
LLAMA_70B = MODEL_CONFIGS / "llama-2-70b-hf"
FALCON_180B = MODEL_CONFIGS / "falcon-180B"
QLORA = {"r": 16, "alpha": 32, "quantization": {"bits": 4, "type": "nf4", "double_quant": True}}
EVAL_DIR = Path("/shared/runs/job_1/evaluations/eval_1")


def spec(model: Path | str, device: str = "cuda", launcher: str = "local", lora: Any = None) -> JobSpec:
    return JobSpec.model_validate(
        {
            "model": {"name_or_path": str(model)},
            "dataset": {"name_or_path": "./d.jsonl"},
            "training": {"max_steps": 1},
            "resources": {"device": device, "launcher": launcher},
            **({"lora": lora} if lora else {}),
        }
    )


def settings(**more: Any) -> Settings:
    return Settings(python="/opt/py/bin/python", slurm_partition="gpu", gpu_memory_gb=80, **more)


def gpus(model: Path, lora: Any = None, per_node: int = 8, memory: int = H100) -> int:
    s = spec(model, lora=lora)
    config = evaluations.load_model_config(str(model))[0]
    return evaluations.evaluation_gpus(s, config, gpu_memory_bytes=memory, gpus_per_node=per_node)


def test_a_base_is_spread_over_the_gpus_its_bf16_weights_need() -> None:
    # Llama 2 70B in bf16: 128 GiB, at most 60% of an 80 GiB GPU each (engine_size's share): 4 GPUs.
    assert gpus(LLAMA_70B) == 4
    # Falcon 180B: 333 GiB in bf16, over 8 (232 heads: a power of two that divides them).
    assert gpus(FALCON_180B) == 8
    # On 40 GiB GPUs 70B needs 8 of them; a node of 4 is all it can get (accelerate keeps the rest in RAM).
    assert gpus(LLAMA_70B, memory=40 * GIB) == 8
    assert gpus(LLAMA_70B, memory=40 * GIB, per_node=4) == 4


def test_a_qlora_base_is_counted_in_4_bits() -> None:
    config = evaluations.load_model_config(str(LLAMA_70B))[0]
    assert config is not None
    four_bit = evaluations.quantized_weights_bytes(config, spec(LLAMA_70B, lora=QLORA)) or 0
    # 68.5e9 Linear weights at 0.516 bytes (nf4 + double-quantized scales), the 0.5e9 others in bf16.
    assert four_bit / GIB == pytest.approx(33.9, abs=0.1)
    assert gpus(LLAMA_70B, lora=QLORA) == 1  # 33.9 GiB: one 80 GiB GPU (48 GiB for the weights)
    assert gpus(FALCON_180B, lora=QLORA) == 2  # 87 GiB in 4 bits, against 333 in bf16
    assert gpus(LLAMA_70B, lora={"r": 16}) == 4  # plain LoRA: the bf16 base


def test_a_cpu_job_or_a_config_not_on_this_machine_takes_one() -> None:
    assert evaluations.evaluation_gpus_of(spec(LLAMA_70B, device="cpu"), settings()) == 1
    not_cached = spec("some-org/not-in-any-cache-70b")
    assert evaluations.evaluation_gpus_of(not_cached, settings()) == 1
    # Locally, at most the pool's GPUs; on SLURM a node's (FTQ_SERVE_GPUS_PER_NODE).
    assert evaluations.evaluation_gpus_of(spec(LLAMA_70B), settings(gpu_pool="0,1")) == 2
    assert evaluations.evaluation_gpus_of(spec(LLAMA_70B, launcher="slurm"), settings()) == 4


def test_the_scheduler_is_asked_for_that_many_gpus_of_the_local_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    row = SimpleNamespace(
        id="eval_1",
        owner="alice",
        launcher="local",
        device="cuda",
        priority=None,
        seq=3,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    kind = evaluations.EvaluationKind()
    assert kind.run_request(row, 4).need == scheduling.Need(scheduling.GPUS, 4)
    assert kind.run_request(row).need == scheduling.Need(scheduling.GPUS, 1)  # exports: one
    slurm = SimpleNamespace(**{**vars(row), "launcher": "slurm"})
    assert kind.run_request(slurm, 4).need == scheduling.Need(None, 0)  # SLURM's, by the script


def test_the_evaluation_sbatch_asks_for_its_gpus_and_their_cpus() -> None:
    s = settings()
    plan = render_export_plan(
        spec(LLAMA_70B, launcher="slurm"),
        export_id="eval_1",
        export_dir=EVAL_DIR,
        settings=s,
        module="trainer.evaluate",
        request="evaluation.json",
        devices=4,
    )
    script = plan.sbatch_script or ""
    assert "#SBATCH --gres=gpu:4" in script and "--gres=gpu:1" not in script
    assert f"#SBATCH --cpus-per-task={4 * s.slurm_cpus_per_gpu}" in script
    assert "#SBATCH --nodes=1" in script and "#SBATCH --ntasks=1" in script
    assert "-m trainer.evaluate" in script and str(EVAL_DIR / "evaluation.json") in script
    # A CPU job's evaluation: one CPU, no GPU, whatever it is told.
    cpu = render_export_plan(
        spec(LLAMA_70B, device="cpu", launcher="slurm"),
        export_id="eval_1",
        export_dir=EVAL_DIR,
        settings=s,
        devices=4,
    )
    assert "--gres" not in (cpu.sbatch_script or "") and "--cpus-per-task=1" in (cpu.sbatch_script or "")
