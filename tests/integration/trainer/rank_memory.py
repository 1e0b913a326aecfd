"""Each rank's memory read from outside: a launch of two CPU ranks, whose processes' PSS
(/proc/<pid>/smaps_rollup) a thread samples from the launch's start until the first logged step.

Inside the trainer a rank can only say how far one phase raised its peak; from outside the whole
process counts (imports, loading, sharding, the optimizer, the first step), which is what a node's RAM
pays. PSS splits shared pages (the torch libraries all ranks map) among the processes that map them,
so the ranks' figures add up to what the node holds.

Also builds the random Llama these measurements need: large enough (500M+ parameters) that a full
copy of the weights cannot hide in the runtime's own memory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness import REPO
from tests.integration.trainer.helpers import accelerate_command, trainer_env, write_spec

MIB = 2**20
SAMPLE_EVERY_S = 0.05


def build_llama(folder: Path, tokenizer_from: Path, *, hidden: int = 2048, layers: int = 12) -> int:
    """A random Llama in bf16 (as released checkpoints are stored) with the tiny tokenizer's 448-token
    vocabulary, so nearly every parameter sits in the decoder layers that FSDP shards; tied embeddings,
    GQA. The defaults give 532M parameters (1.07 GB on disk). Returns the parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 43 // 16,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 128,
        num_key_value_heads=4,
        vocab_size=448,  # the tiny tokenizer's
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: half the builder's memory
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tokenizer_from / name, folder / name)
    return sum(p.numel() for p in model.parameters())


def write_rows(path: Path) -> Path:
    """Two identical rows: the first step's loss is then the same however the rows are split among ranks."""
    row = json.dumps({"text": "one two three four five six seven eight nine ten"})
    path.write_text((row + "\n") * 2)
    return path


def one_step_spec(model: Path, data: Path, mixed_precision: str = "no") -> dict[str, Any]:
    """One LoRA step of 16-token rows, one row a process, on the CPU (the caller sets the strategy and
    the processes)."""
    return {
        "model": {"name_or_path": str(model)},
        "dataset": {"name_or_path": str(data)},
        "training": {
            "max_seq_len": 16,
            "max_steps": 1,
            "per_device_train_batch_size": 1,
            "learning_rate": 1e-3,
            "logging_steps": 1,
            "save_steps": None,
            "packing": False,
            "gradient_checkpointing": False,
            "mixed_precision": mixed_precision,
            "seed": 1,
        },
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "resources": {"device": "cpu"},
    }


def pss_kib(pid: int) -> int | None:
    """The process's proportional set size in KiB, or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _rank_of(pid: int) -> int | None:
    """RANK from the environment of a `-m trainer` process (the ranks torchrun starts), else None."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"trainer" not in cmdline:
            return None
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            found.append(child)
            todo.append(child)
    return found


@dataclass
class RankMemory:
    """What the sampler saw: each rank's PSS peak (MiB) up to the first logged step, and after it."""

    peak_to_first_step: dict[int, float] = field(default_factory=dict)
    peak_whole_run: dict[int, float] = field(default_factory=dict)
    first_step_at: float | None = None  # seconds after the launch began
    samples: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # rank -> (s, MiB)


def _sample(launcher: subprocess.Popen[str], metrics: Path, seen: RankMemory, done: threading.Event) -> None:
    started = time.monotonic()
    ranks: dict[int, int] = {}  # pid -> rank
    while not done.is_set() and launcher.poll() is None:
        if len(ranks) < 2:
            for pid in _descendants(launcher.pid):
                if pid not in ranks and (rank := _rank_of(pid)) is not None:
                    ranks[pid] = rank
        now = time.monotonic() - started
        if seen.first_step_at is None and metrics.exists() and metrics.stat().st_size > 0:
            seen.first_step_at = now
        for pid, rank in ranks.items():
            kib = pss_kib(pid)
            if kib is None:
                continue
            mib = kib / 1024
            seen.samples.setdefault(rank, []).append((now, mib))
            seen.peak_whole_run[rank] = max(seen.peak_whole_run.get(rank, 0.0), mib)
            if seen.first_step_at is None:
                seen.peak_to_first_step[rank] = max(seen.peak_to_first_step.get(rank, 0.0), mib)
        done.wait(SAMPLE_EVERY_S)


def launch_measured(
    spec: dict[str, Any], workdir: Path, config_yaml: str, timeout: int = 600
) -> tuple[subprocess.CompletedProcess[str], RankMemory]:
    """`spec` under `accelerate launch` with two CPU ranks (the run directory is `workdir/run`), each
    rank's PSS sampled from outside while it runs."""
    cfg = workdir / "accelerate_config.yaml"
    cfg.write_text(config_yaml)
    out = workdir / "run"
    args = ["--spec", str(write_spec(workdir / "spec.json", spec)), "--output_dir", str(out)]
    cmd = accelerate_command(cfg)
    launcher = subprocess.Popen(
        [*cmd, "-m", "trainer", *args],
        cwd=REPO,
        env=trainer_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen, done = RankMemory(), threading.Event()
    sampler = threading.Thread(target=_sample, args=(launcher, out / "metrics.jsonl", seen, done))
    sampler.start()
    try:
        stdout, stderr = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        launcher.kill()
        stdout, stderr = launcher.communicate()
    finally:
        done.set()
        sampler.join()
    proc = subprocess.CompletedProcess(launcher.args, launcher.returncode, stdout, stderr)
    return proc, seen
