"""What jobs train on: the tiny model and data `make install` builds into examples/tiny, one spec shape for
a tiny CPU job, the shipped examples, and config-only stand-ins for models nothing here loads."""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tests.harness.env import REPO

EXAMPLES = REPO / "examples"
# `make install` runs `python -m trainer.tiny --out examples/tiny`; tiny_assets() does the same if need be.
TINY = EXAMPLES / "tiny"
# The same folder as a spec names it relative to the service's default roots (examples/ is one).
TINY_RELATIVE = "./tiny"
# The examples' large models as their config.json only (all the memory estimate reads): llama-2-70b-hf,
# falcon-180B.
MODEL_CONFIGS = Path(__file__).resolve().parent / "data" / "models"
_TINY_FILES = (
    "model/config.json",
    "model/model.safetensors",
    "model-no-weights/config.json",
    "data/train.jsonl",
    "data/eval.jsonl",
    "data/no_text_field.jsonl",
    "chat/train.jsonl",
    "preference/train.jsonl",
    "preference_chat/train.jsonl",
    "unpaired/train.jsonl",
    "prompt_completion/train.jsonl",
    "model-plain-template/config.json",
    "model-serve/config.json",
)


def no_text_field_folder(root: Path) -> Path:
    """A dataset folder under `root` whose train.jsonl holds the tiny text under `body`, not `text`.
    Preflight reads the first rows of a single .jsonl file (a 422 at POST), not a folder's files: this
    is the case that reaches the trainer, which names the missing field itself."""
    folder = root / "no_text_field"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tiny_assets() / "data" / "no_text_field.jsonl", folder / "train.jsonl")
    return folder


def tiny_assets() -> Path:
    """examples/tiny: the tiny model (with and without weights) and its text and chat data. Built here by
    the real entry point when `make install` has not built it yet (once, under a lock)."""
    if all((TINY / f).exists() for f in _TINY_FILES):
        return TINY
    with open(Path(tempfile.gettempdir()) / "ftq-tests-tiny.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all((TINY / f).exists() for f in _TINY_FILES):
            subprocess.run(
                [sys.executable, "-m", "trainer.tiny", "--out", str(TINY)],
                cwd=REPO,
                check=True,
                stdout=subprocess.DEVNULL,
                timeout=600,
            )
    return TINY


def tiny_spec(
    tiny: Path | str = TINY,
    *,
    name: str = "tiny",
    max_steps: int = 4,
    processes: int = 1,
    dataset: str = "train.jsonl",
    **training: Any,
) -> dict[str, Any]:
    """A LoRA job on the tiny model on the CPU, as a POST /jobs body: a few seconds of training a step.

    `tiny` is where the assets are: an absolute folder (the service must allow it in FTQ_LOCAL_ROOTS), or
    TINY_RELATIVE for a server on its default roots. `processes` > 1 runs DDP on that many CPU processes;
    `training` overrides fields of the training section (save_steps=2, logging_steps=...).
    """
    root = str(tiny).rstrip("/")
    spec: dict[str, Any] = {
        "name": name,
        "model": {"name_or_path": f"{root}/model", "attn_implementation": "sdpa"},
        "dataset": {"name_or_path": f"{root}/data/{dataset}", "text_field": "text"},
        "training": {
            "max_steps": max_steps,
            "max_seq_len": 64,
            "logging_steps": 1,
            "learning_rate": 1e-3,
            "mixed_precision": "no",
            "save_steps": None,
            "per_device_train_batch_size": 2,
            **training,
        },
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
        "resources": {"launcher": "local", "device": "cpu", "processes_per_node": processes},
    }
    if processes > 1:
        spec["distributed"] = {"strategy": "ddp"}
    return spec


def example_spec(name: str = "tiny-cpu.yaml", **training: Any) -> dict[str, Any]:
    """A shipped example (examples/<name>) as a dict, with training fields overridden."""
    spec: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    spec.setdefault("training", {}).update(training)
    return spec


def one_process_example(**training: Any) -> dict[str, Any]:
    """examples/tiny-cpu.yaml on one process, for a test whose point is not DDP (a job to cancel, to
    follow, to show): the shipped run's two ranks cost twice the CPU on the 2-core machine."""
    spec = example_spec(**training)
    spec["distributed"] = {"strategy": "none"}
    spec["resources"]["processes_per_node"] = 1
    return spec


def model_config(name: str) -> dict[str, Any]:
    """config.json of one of the examples' large models (MODEL_CONFIGS: llama-2-70b-hf, falcon-180B)."""
    return dict(json.loads((MODEL_CONFIGS / name / "config.json").read_text()))


# A config.json the memory estimate can read; with an empty weights file, a folder preflight accepts as a
# model (nothing loads it, so the content of the weights does not matter).
CONFIG_ONLY_MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "torch_dtype": "float32",
}


def config_only_model(path: Path) -> Path:
    """A model folder that passes preflight but cannot train: CONFIG_ONLY_MODEL and an empty weights file."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(CONFIG_ONLY_MODEL))
    (path / "model.safetensors").write_bytes(b"")
    return path


def text_dataset(path: Path, rows: int = 8) -> Path:
    """A JSON-lines file of `rows` rows with a `text` field."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": f"hello {i}"}) + "\n" for i in range(rows)))
    return path


def checkpoint_dir(run_dir: Path, step: int, kind: str = "lora", ranks: int = 2) -> Path:
    """checkpoints/checkpoint-<step> laid out as the trainer writes it, each file a byte long:
    "lora" (one process: adapter, optimizer, scheduler, RNG), "deepspeed" (ZeRO's global_step<N> folder of
    per-rank model and optimizer partitions, `latest` pointing at it) or "fsdp" (torch.distributed.checkpoint
    folders for the model and the optimizer, each with the .metadata written after every rank's shards);
    trainer_state.json, which the trainer writes last, in each."""
    ckpt = run_dir / "checkpoints" / f"checkpoint-{step}"
    files: list[str] = ["scheduler.pt"]
    if kind == "lora":
        files += ["adapter_model.safetensors", "optimizer.pt", "rng_state.pth"]
    elif kind == "deepspeed":
        for rank in range(ranks):
            files += [
                f"global_step{step}/zero_pp_rank_{rank}_mp_rank_00_model_states.pt",
                f"global_step{step}/bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt",
            ]
        files.append("latest")
    elif kind == "fsdp":
        for folder in ("pytorch_model_fsdp_0", "optimizer_0"):
            files += [f"{folder}/__{rank}_0.distcp" for rank in range(ranks)] + [f"{folder}/.metadata"]
    else:
        raise ValueError(f"no checkpoint kind {kind!r}")
    if kind != "lora":
        files += [f"rng_state_{rank}.pth" for rank in range(ranks)]
    for name in files:
        path = ckpt / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"global_step{step}".encode() if name == "latest" else b"x")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return ckpt
