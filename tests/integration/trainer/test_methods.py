"""Every training method as a real `accelerate launch` of the trainer on the CPU (trainer/train.py
`build_trainer`): DPO with LoRA (its reward margin rises on the tiny preference set), KTO, a reward model
and SFT on prompt/completion data with the loss on the completion, each on one process; DPO with LoRA
under FSDP2 (on a file in OpenAI's preference format) and under ZeRO-3, and full DPO under both, on two
processes (sharding is their point)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from tests.integration.trainer.helpers import explain, launch_spec, points, run_trainer, write_spec

pytestmark = pytest.mark.slow

DPO_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")


def method_spec(
    tiny_dir: Path,
    method: str,
    dataset: str,
    *,
    strategy: str = "none",
    model: str = "model",
    **training: Any,
) -> dict[str, Any]:
    """The method's job on the tiny model: on two processes under a sharding strategy ("fsdp", or "zero3":
    DeepSpeed ZeRO stage 3, as the Falcon article runs it), on one otherwise. The batch is 8 sequences a
    step either way (4 a process on two)."""
    processes = 1 if strategy == "none" else 2
    spec: dict[str, Any] = {
        "model": {"name_or_path": str(tiny_dir / model), "attn_implementation": "sdpa"},
        "dataset": {"name_or_path": str(tiny_dir / dataset)},
        "training": {
            "method": method,
            "max_steps": 4,
            "max_seq_len": 64,
            "logging_steps": 1,
            "learning_rate": 5e-3,
            "mixed_precision": "no",
            "save_steps": None,
            "per_device_train_batch_size": 8 // processes,
            **training,
        },
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
        "distributed": (
            {"strategy": "deepspeed", "deepspeed": {"zero_stage": 3}}
            if strategy == "zero3"
            else {"strategy": strategy}
        ),
        "resources": {"launcher": "local", "device": "cpu", "processes_per_node": processes},
    }
    return spec


def launch(spec: dict[str, Any], tmp_path: Path) -> tuple[Path, str]:
    """Launch the spec as the worker would (ftq's rendered accelerate config, --spec); the run dir and log."""
    proc = launch_spec(spec, tmp_path)
    assert proc.returncode == 0, explain(proc)
    return tmp_path / "run", proc.stderr


def train_points(run_dir: Path) -> list[dict[str, Any]]:
    return [p for p in points(run_dir) if p["loss"] is not None]


# The one-process runs, launched side by side once for the module: a run of the tiny model is mostly its
# imports on one core, so on the two-core machine four at once take about the time of two.
ONE_PROCESS_RUNS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "dpo": ("dpo", "preference/train.jsonl", {"max_steps": 12, "dpo": {"beta": 0.1}}),
    "kto": ("kto", "unpaired/train.jsonl", {"kto": {"desirable_weight": 1.0}}),
    "reward": ("reward", "preference/train.jsonl", {"max_steps": 6}),
    "sft": ("sft", "prompt_completion/train.jsonl", {"loss_on": "completion"}),
    # QLoRA on bitsandbytes' CPU kernels: the base model's Linear layers in 4-bit NF4, bf16 compute.
    "qlora": ("sft", "data/train.jsonl", {"mixed_precision": "bf16"}),
}
QUANTIZATION = {"bits": 4, "type": "nf4", "double_quant": True, "compute_dtype": "bf16"}


@pytest.fixture(scope="module")
def one_process(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Each of ONE_PROCESS_RUNS launched (all at once): its run directory and log, by name."""
    from concurrent.futures import ThreadPoolExecutor

    # The folders first, in this thread: pytest's TempPathFactory is not thread-safe (its first mktemp
    # makes the session's base folder, which concurrent calls then race over).
    folders = {name: tmp_path_factory.mktemp(name) for name in ONE_PROCESS_RUNS}

    def run(name: str) -> tuple[Path, str]:
        method, dataset, training = ONE_PROCESS_RUNS[name]
        spec = method_spec(tiny_dir, method, dataset, **training)
        if name == "qlora":
            spec["lora"]["quantization"] = QUANTIZATION
        return launch(spec, folders[name])

    with ThreadPoolExecutor(len(ONE_PROCESS_RUNS)) as pool:
        return dict(zip(ONE_PROCESS_RUNS, pool.map(run, ONE_PROCESS_RUNS), strict=True))


def test_qlora_trains_an_adapter_over_4_bit_base_weights(one_process: dict[str, tuple[Path, str]]) -> None:
    # Issue 27 (11): bitsandbytes runs 4-bit weights on this CPU, so QLoRA is tested here, not only on a GPU.
    from safetensors.torch import load_file

    out, log = one_process["qlora"]
    # Every Linear layer of the tiny model's two decoder layers (q, k, v, o, gate, up, down) is 4-bit.
    assert "QLoRA: 14 Linear layers in 4-bit nf4, computing in bf16" in log
    pts = train_points(out)
    assert [p["step"] for p in pts] == [1, 2, 3, 4]
    assert all(0 < p["loss"] < 20 for p in pts), pts
    adapter = load_file(out / "final" / "adapter_model.safetensors")
    assert any(float(t.abs().sum()) > 0 for k, t in adapter.items() if "lora_B" in k)  # it trained


def test_dpo_with_lora_raises_the_reward_margin_with_the_adapter_as_reference(
    one_process: dict[str, tuple[Path, str]],
) -> None:
    out, log = one_process["dpo"]
    assert "method dpo (trl.DPOTrainer) on preference data" in log
    assert "reference model: the base model with the LoRA adapter disabled (no second copy loaded)" in log

    pts = train_points(out)
    assert [p["step"] for p in pts] == list(range(1, 13))
    for p in pts:
        assert all(isinstance(p["extra"][name], float) for name in DPO_METRICS), p
    margins = [p["extra"]["rewards/margins"] for p in pts]
    first, last = sum(margins[:3]) / 3, sum(margins[-3:]) / 3
    assert last > first + 0.1, f"the reward margin went from {first:.3f} to {last:.3f}: {margins}"
    assert sum(p["extra"]["rewards/accuracies"] for p in pts[-3:]) / 3 >= 0.75
    assert json.loads((out / "final" / "adapter_config.json").read_text())["task_type"] == "CAUSAL_LM"


def test_kto_trains_on_unpaired_preferences(one_process: dict[str, tuple[Path, str]]) -> None:
    out, log = one_process["kto"]
    assert "method kto (trl.KTOTrainer) on unpaired_preference data" in log
    assert "no second copy loaded" in log
    pts = train_points(out)
    assert [p["step"] for p in pts] == [1, 2, 3, 4]
    assert all("kl" in p["extra"] and "rewards/chosen" in p["extra"] for p in pts), pts
    assert (out / "final" / "adapter_model.safetensors").is_file()


def test_reward_model_logs_its_accuracy_and_saves_the_score_head(
    one_process: dict[str, tuple[Path, str]],
) -> None:
    out, log = one_process["reward"]
    assert "method reward (trl.RewardTrainer) on preference data" in log
    pts = train_points(out)
    assert len(pts) == 6
    assert all(0.0 <= p["extra"]["accuracy"] <= 1.0 and "margin" in p["extra"] for p in pts), pts
    adapter = json.loads((out / "final" / "adapter_config.json").read_text())
    assert adapter["task_type"] == "SEQ_CLS"

    from safetensors import safe_open

    with safe_open(str(out / "final" / "adapter_model.safetensors"), "pt") as f:
        assert any(".score." in name for name in f.keys())  # noqa: SIM118 (safe_open has no __iter__)


def test_sft_on_prompt_completion_with_the_loss_on_the_completion(
    one_process: dict[str, tuple[Path, str]],
) -> None:
    out, log = one_process["sft"]
    assert "method sft (trl.SFTTrainer) on prompt_completion data" in log
    pts = train_points(out)
    assert [p["step"] for p in pts] == [1, 2, 3, 4]
    assert all(p["loss"] > 0 for p in pts)
    assert (out / "final" / "adapter_model.safetensors").is_file()


def openai_preference(tiny_dir: Path, out: Path) -> Path:
    """The tiny conversational preference set in OpenAI's preference format."""
    rows = [
        json.loads(line) for line in (tiny_dir / "preference_chat" / "train.jsonl").read_text().splitlines()
    ]
    out.write_text(
        "".join(
            json.dumps(
                {
                    "input": {"messages": r["prompt"]},
                    "preferred_output": r["chosen"],
                    "non_preferred_output": r["rejected"],
                }
            )
            + "\n"
            for r in rows
        )
    )
    return out


def test_dpo_with_lora_under_fsdp2(tiny_dir: Path, tmp_path: Path) -> None:
    # On a file in OpenAI's preference format (format: auto finds it), read as conversational pairs.
    # In bf16: FSDP2's mixed-precision policy (bf16 compute) on two processes.
    spec = method_spec(
        tiny_dir, "dpo", "preference/train.jsonl", strategy="fsdp", max_steps=3, mixed_precision="bf16"
    )
    spec["dataset"]["name_or_path"] = str(openai_preference(tiny_dir, tmp_path / "openai_preference.jsonl"))
    out, log = launch(spec, tmp_path)
    assert "method dpo (trl.DPOTrainer) on openai_preference data" in log
    assert "engaged fsdp" in log  # FSDP really ran, not accelerate's DDP fallback on CPU
    assert "FSDP computes in bfloat16" in log
    # The frozen base loaded and sharded in bf16 (half of float32's shards, host RAM and broadcast); only
    # the adapter, which the optimizer updates, is upcast to float32 by accelerate's prepare.
    assert "dtype torch.bfloat16, LoRA" in log
    (dtypes,) = [line for line in log.splitlines() if "sharded parameters:" in line]
    # (measured: frozen bfloat16 (131,392), trainable float32 (16,384))
    assert re.search(
        r"sharded parameters: frozen bfloat16 \([\d,]+\), trainable float32 \([\d,]+\)$", dtypes
    ), dtypes
    assert "no second copy loaded" in log
    pts = train_points(out)
    assert [p["step"] for p in pts] == [1, 2, 3] and all(math.isfinite(p["loss"]) for p in pts)
    assert all(name in pts[-1]["extra"] for name in DPO_METRICS)
    assert (out / "final" / "adapter_model.safetensors").is_file()


def test_dpo_with_lora_under_zero3_saves_the_whole_adapter(tiny_dir: Path, tmp_path: Path) -> None:
    # The Falcon 180B example's setup (LoRA under ZeRO-3) with DPO: the reference is the base with the adapter
    # off, and the final adapter is gathered from the shards, not saved as ZeRO-3's empty placeholders.
    from safetensors.torch import load_file

    # In bf16, as the Falcon job trains: DeepSpeed's bf16 path (bf16 weights, float32 optimizer state).
    spec = method_spec(
        tiny_dir, "dpo", "preference/train.jsonl", strategy="zero3", max_steps=3, mixed_precision="bf16"
    )
    out, log = launch(spec, tmp_path)
    assert "engaged deepspeed" in log and "no second copy loaded" in log
    assert "dtype torch.bfloat16" in log  # the model line: loaded in the half dtype DeepSpeed trains in
    pts = train_points(out)
    assert [p["step"] for p in pts] == [1, 2, 3] and all(math.isfinite(p["loss"]) for p in pts)
    assert all(name in pts[-1]["extra"] for name in DPO_METRICS)
    adapter = load_file(out / "final" / "adapter_model.safetensors")
    assert adapter and all(t.numel() > 0 and 8 in t.shape for t in adapter.values())
    assert any(float(t.abs().sum()) > 0 for k, t in adapter.items() if "lora_B" in k)  # it trained


def test_full_dpo_under_fsdp_and_zero3_shards_a_reference_equal_to_the_start(
    tiny_dir: Path, tmp_path: Path
) -> None:
    # Full fine-tuning: the reference is a second copy of the model, sharded like the policy. DPO's
    # first loss is ln 2 only when that copy equals the starting policy, and both shardings of the same
    # run must train alike.

    from safetensors.torch import load_file

    base = load_file(tiny_dir / "model" / "model.safetensors")
    losses = {}
    for strategy, said in (("fsdp", "sharded by FSDP"), ("zero3", "prepared by DeepSpeed")):
        spec = method_spec(
            tiny_dir, "dpo", "preference/train.jsonl", strategy=strategy, max_steps=3, learning_rate=1e-4
        )
        del spec["lora"]
        (tmp_path / strategy).mkdir()
        out, log = launch(spec, tmp_path / strategy)
        assert f"reference model: a second copy of the model, {said}" in log
        losses[strategy] = [p["loss"] for p in train_points(out)]
        saved = load_file(out / "final" / "model.safetensors")
        assert saved.keys() == base.keys() and all(saved[k].shape == base[k].shape for k in base)
        assert any(not saved[k].equal(base[k]) for k in base)  # trained, and saved whole
    assert math.isclose(losses["fsdp"][0], math.log(2), abs_tol=1e-4)
    assert losses["fsdp"] == pytest.approx(losses["zero3"], abs=1e-3)


def test_assistant_only_loss_on_a_template_without_markers_fails_naming_the_fix(
    tiny_dir: Path, tmp_path: Path
) -> None:
    spec = method_spec(tiny_dir, "sft", "chat/train.jsonl", model="model-plain-template", loss_on="assistant")
    spec_file = write_spec(tmp_path / "spec.json", spec)
    proc = run_trainer(["--spec", str(spec_file), "--output_dir", str(tmp_path / "run")])
    assert proc.returncode == 2, explain(proc)
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("ftq-error:"))
    assert line.startswith("ftq-error: model_error: loss_on assistant")
    assert "{% generation %}" in line and "loss_on: all" in line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # it never trained on all tokens instead
