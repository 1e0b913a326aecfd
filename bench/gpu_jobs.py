"""Real jobs at 8B scale on one GPU: what bench/gpu.sh runs on a lent H200 (or any CUDA machine).

    python -m bench.gpu_jobs --out DIR                 # on the GPU machine, about 10 minutes on an H200
    python -m bench.gpu_jobs --out DIR --dry-run       # on CPU with the tiny model: the same code paths

Every job is the real thing: a JobSpec rendered by ftq.planning.render into the accelerate config and command
the
worker would run (`accelerate launch -m trainer`), on models built from a config with random weights
and saved in bf16 to local disk once (no hub). Measured per job:

- tokens/s from the trainer's own metrics (the median point after the first), model FLOPs utilisation
  (PaLM's accounting: 6N per token for full fine-tuning, 4N for LoRA, whose frozen weights get no
  gradient, plus 12 x layers x hidden x attended length; over the GPU's dense bf16 peak), and the peak
  GPU memory the job used (nvidia-smi, sampled) next to ftq's estimate for the same spec;
- peak host RSS per rank (VmHWM of every process of the launch, sampled), and the trainer's own
  `peak RSS` lines for loading and the final save.

Jobs (`--dry-run` shrinks the models, the steps and the matrix; every step is still a real launch):

1. items 1-2 of issue 14 at 8B scale: a LoRA job of the Llama-3-8B-shaped model under FSDP2 on two CPU
   ranks (one GPU cannot hold two NCCL ranks) with `cpu_ram_efficient_loading`: rank 1's loading peak
   must be a small fraction of rank 0's, and `final/` must hold the adapter alone;
2. the 8B model with LoRA and a ~1B model fully fine-tuned, each with flash attention (when flash_attn
   imports) and sdpa, packed and padded: tokens/s, MFU and peak memory against the estimate.

Results: DIR/gpu_jobs.json and a printed table (also DIR/gpu_jobs.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import REPO
from ftq.contract.spec import JobSpec
from ftq.planning.estimate import estimate_memory, parse_arch
from ftq.planning.render import render_plan
from ftq.runtime.settings import Settings

GiB = 1024**3
# Dense bf16 peak (TFLOP/s) by device name fragment; the first match wins.
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0}

LLAMA3_8B: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
    "pad_token_id": 0,
}  # fmt: skip
LLAMA_1B: dict[str, Any] = {
    **LLAMA3_8B, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "head_dim": 64, "tie_word_embeddings": True,
}  # fmt: skip
# --dry-run: the same shapes' kinds at a size two CPU cores train in seconds (the tiny tokenizer's vocab).
DRY_BIG: dict[str, Any] = {
    **LLAMA3_8B, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
}  # fmt: skip
DRY_SMALL: dict[str, Any] = {
    **DRY_BIG,
    "hidden_size": 64,
    "intermediate_size": 128,
    "tie_word_embeddings": True,
}

# No job starts after this many seconds (each then has its own bound): the device lends 15 minutes.
BUDGET_S = 540.0
PEAK_LINE = re.compile(r"rank (\d+) (loading|final save)[^:]*: peak RSS (?:at most )?\+(\d+) MiB")


@dataclass
class Job:
    name: str
    model: str  # "big" (8B) or "small" (1B)
    lora: bool
    attn: str
    packing: bool
    steps: int
    seq: int
    batch: int
    device: str = "cuda"
    processes: int = 1
    strategy: str = "none"
    timeout_s: float = 600.0


@dataclass
class Result:
    job: Job
    exit_code: int | None = None
    seconds: float = 0.0
    tokens_per_second: float | None = None
    mfu: float | None = None
    peak_gpu_bytes: int | None = None
    estimate_bytes: int | None = None
    usable_bytes: int | None = None
    estimate_host_bytes: int | None = None
    peak_rss_by_rank: dict[str, int] = field(default_factory=dict)
    phase_rss_mib: dict[str, int] = field(default_factory=dict)
    final_files: dict[str, int] = field(default_factory=dict)
    error: str | None = None


# Models and data -------------------------------------------------------------------------------------------


def build_model(folder: Path, config: dict[str, Any], tokenizer_from: Path, device: str) -> Path:
    """A random model from `config`, saved in bf16 with the tiny tokenizer (token ids fit any vocab)."""
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return folder
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(**{k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    for item in tokenizer_from.iterdir():
        if item.name.startswith("tokenizer") or item.name.endswith(".jinja"):
            shutil.copy2(item, folder / item.name)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return folder


def write_dataset(path: Path, rows: int, mean_words: float, seed: int = 0) -> Path:
    """Mixed-length `text` rows (log-normal, as SFT data is): what packing and padding differ on."""
    rng = random.Random(seed)
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    with path.open("w") as fh:
        for _ in range(rows):
            n = max(4, int(rng.lognormvariate(0, 0.8) * mean_words))
            fh.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(n))}) + "\n")
    return path


# Specs and launches ----------------------------------------------------------------------------------------


def job_spec(job: Job, model_dir: Path, data: Path) -> JobSpec:
    body: dict[str, Any] = {
        "name": job.name,
        "model": {"name_or_path": str(model_dir), "attn_implementation": job.attn},
        "dataset": {"name_or_path": str(data), "format": "text"},
        "training": {
            "max_seq_len": job.seq,
            "max_steps": job.steps,
            "per_device_train_batch_size": job.batch,
            "learning_rate": 1e-4,
            "lr_scheduler_type": "constant",
            "logging_steps": max(1, job.steps // 10),
            "save_steps": None,
            "packing": job.packing,
            "gradient_checkpointing": True,
            "mixed_precision": "bf16" if job.device == "cuda" else "no",
        },
        "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"} if job.lora else None,
        "distributed": {"strategy": job.strategy},
        "resources": {"launcher": "local", "device": job.device, "processes_per_node": job.processes},
    }
    if job.strategy == "fsdp":
        body["distributed"]["fsdp"] = {"version": 2, "cpu_ram_efficient_loading": True}
    return JobSpec.model_validate(body)


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _rank_and_hwm(pid: int) -> tuple[str | None, int]:
    try:
        env = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        status = (Path("/proc") / str(pid) / "status").read_text()
    except OSError:
        return None, 0
    rank = next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"RANK=")), None)
    if rank is None and b"-m\0trainer\0" in _cmdline(pid):
        rank = "0"  # one process: accelerate runs the trainer without a RANK
    hwm = next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    return rank, hwm


def _cmdline(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def gpu_used_bytes() -> int | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(int(x) for x in out.split()) * 2**20


class Sampler(threading.Thread):
    """Every `every` s: the peak RSS (VmHWM) of each rank of the launch, and the GPU memory in use."""

    def __init__(self, root: int, gpu: bool, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.root, self.gpu, self.every = root, gpu, every
        self.rss: dict[str, int] = {}
        self.gpu_baseline = gpu_used_bytes() if gpu else None
        self.gpu_peak: int | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for pid in descendants(self.root):
                rank, hwm = _rank_and_hwm(pid)
                if rank is not None:
                    self.rss[rank] = max(self.rss.get(rank, 0), hwm)
            if self.gpu and (used := gpu_used_bytes()) is not None:
                self.gpu_peak = max(self.gpu_peak or 0, used - (self.gpu_baseline or 0))
            self.done.wait(self.every)


def run_job(job: Job, model_dir: Path, data: Path, runs: Path, peak_tflops: float | None) -> Result:
    from tests.harness import free_port

    spec = job_spec(job, model_dir, data)
    run_dir = runs / job.name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    config = json.loads((model_dir / "config.json").read_text())
    est = estimate_memory(spec, config, device_memory_bytes=141 * 10**9)
    plan = render_plan(
        spec, job_id=job.name, run_dir=run_dir, settings=Settings(python=sys.executable),
        main_process_port=free_port(),
    )  # fmt: skip
    (run_dir / "spec.json").write_text(spec.model_dump_json())
    (run_dir / "accelerate_config.yaml").write_text(plan.accelerate_config_yaml)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    result = Result(job=job, estimate_bytes=est.per_device_bytes, usable_bytes=est.usable_device_bytes)
    result.estimate_host_bytes = est.host_bytes_per_node
    started = time.monotonic()
    with (run_dir / "train.log").open("wb") as log:
        proc = subprocess.Popen(
            plan.command, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        sampler = Sampler(proc.pid, gpu=job.device == "cuda")
        sampler.start()
        try:
            result.exit_code = proc.wait(timeout=job.timeout_s)
        except subprocess.TimeoutExpired:
            # The bench must end within the device's time: a job over its share is stopped, not waited on.
            os.killpg(proc.pid, 9)
            result.exit_code = proc.wait()
            result.error = f"stopped after {job.timeout_s:.0f} s (its share of the bench's time)"
        sampler.done.set()
        sampler.join()
    result.seconds = time.monotonic() - started
    result.peak_rss_by_rank = dict(sorted(sampler.rss.items()))
    result.peak_gpu_bytes = sampler.gpu_peak
    text = (run_dir / "train.log").read_text(errors="replace")
    for rank, phase, mib in PEAK_LINE.findall(text):
        result.phase_rss_mib[f"rank {rank} {phase}"] = int(mib)
    final = run_dir / "final"
    if final.is_dir():
        result.final_files = {p.name: p.stat().st_size for p in sorted(final.iterdir()) if p.is_file()}
    if result.exit_code != 0:
        result.error = (result.error or "") + " | ".join(text.strip().splitlines()[-5:])[-800:]
        return result
    tps = tokens_per_second(run_dir / "metrics.jsonl")
    result.tokens_per_second = tps
    if tps is not None and peak_tflops:
        result.mfu = (
            tps * flops_per_token(config, job, mean_doc_tokens(data, model_dir)) / (peak_tflops * 1e12)
        )
    return result


def tokens_per_second(metrics: Path) -> float | None:
    """The median of the trainer's own points after the first (which holds the warm-up)."""
    if not metrics.is_file():
        return None
    points = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    values = [p["tokens_per_second"] for p in points if p.get("tokens_per_second")]
    return statistics.median(values[1:] or values) if values else None


def mean_doc_tokens(data: Path, model_dir: Path) -> float:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    texts = [json.loads(line)["text"] for line in data.read_text().splitlines()[:200]]
    return statistics.mean(len(tok(t)["input_ids"]) + 1 for t in texts)


def flops_per_token(config: dict[str, Any], job: Job, mean_doc: float) -> float:
    """PaLM's model FLOPs per trained token: 6N (full) or 4N (LoRA: no weight gradients) for the matmuls,
    N without the embedding lookup but with the head; plus 12 x layers x hidden x the attended length,
    which is a document's under flash attention with packing (position_ids restart) and the row's
    otherwise."""
    arch = parse_arch(config)
    if arch is None:
        raise ValueError("not a model the estimate can count")
    n = arch.layers * arch.layer_params + arch.vocab * arch.hidden
    attended = min(mean_doc, job.seq) if (job.packing and job.attn.startswith("flash")) else job.seq
    return (4 if job.lora else 6) * n + 12 * arch.layers * arch.hidden * attended


# The matrix ------------------------------------------------------------------------------------------------


def plan_jobs(dry_run: bool, attns: list[str], steps_big: int, steps_small: int) -> list[Job]:
    """Sized for ~10 minutes of an H200: the training matrix first, then the 8B RAM check on CPU."""
    if dry_run:
        return [
            Job("big-lora-sdpa-packed", "big", True, "sdpa", True, steps_big, 128, 2, "cpu"),
            Job("rss-fsdp2-lora", "big", True, "sdpa", True, 2, 64, 1, "cpu", 2, "fsdp"),
        ]
    jobs = []
    for attn in attns:
        for packing in (True, False):
            kind = "packed" if packing else "padded"
            jobs.append(
                Job(f"8b-lora-{attn}-{kind}", "big", True, attn, packing, steps_big, 2048, 2, timeout_s=150)
            )
            jobs.append(
                Job(
                    f"1b-full-{attn}-{kind}",
                    "small",
                    False,
                    attn,
                    packing,
                    steps_small,
                    2048,
                    4,
                    timeout_s=120,
                )
            )
    # The first pair is the headline figure; the RAM check comes next, before the variants that a short
    # budget may skip.
    rss = Job("rss-fsdp2-lora-8b", "big", True, "sdpa", True, 1, 64, 1, "cpu", 2, "fsdp", timeout_s=300)
    return [*jobs[:2], rss, *jobs[2:]]


def flash_attn_importable() -> bool:
    """What the trainer's `auto` asks: flash_attn imports (an installed wheel built for another torch
    raises ImportError, OSError or RuntimeError)."""
    import importlib

    try:
        importlib.import_module("flash_attn")
    except (ImportError, OSError, RuntimeError):
        return False
    return True


def table(results: list[Result]) -> str:
    head = (
        "| job | exit | s | tokens/s | MFU | peak GPU GiB | estimate GiB (usable) | peak RSS GiB by rank "
        "| notes |"
    )
    lines = [head, "|" + " --- |" * 9]

    def gib(n: int | None) -> str:
        return f"{n / GiB:.1f}" if n is not None else "-"

    for r in results:
        rss = ", ".join(f"{rank}: {gib(b)}" for rank, b in r.peak_rss_by_rank.items()) or "-"
        notes = "; ".join(f"{k} +{v} MiB" for k, v in r.phase_rss_mib.items())
        if r.final_files:
            notes += ("; " if notes else "") + "final/: " + ", ".join(r.final_files)
        if r.error:
            notes += ("; " if notes else "") + r.error[:200]
        lines.append(
            f"| {r.job.name} | {r.exit_code} | {r.seconds:.0f} | "
            + (f"{r.tokens_per_second:.0f}" if r.tokens_per_second else "-")
            + f" | {f'{r.mfu:.1%}' if r.mfu is not None else '-'} | {gib(r.peak_gpu_bytes)} | "
            + f"{gib(r.estimate_bytes)} ({gib(r.usable_bytes)}) | {rss} | {notes} |"
        )
    return "\n".join(lines)


def ram_check(result: Result) -> dict[str, Any]:
    """Items 1-2: rank 1 loads on meta (a fifth of rank 0's loading peak at most), final/ is the adapter."""
    loading = {k: v for k, v in result.phase_rss_mib.items() if k.endswith("loading")}
    r0, r1 = loading.get("rank 0 loading"), loading.get("rank 1 loading")
    adapter_only = bool(result.final_files) and not any(
        name.startswith("model") and name.endswith(".safetensors") for name in result.final_files
    )
    return {
        "loading_mib": loading,
        "rank1_under_a_fifth_of_rank0": r0 is not None and r1 is not None and r1 * 5 < r0,
        "final_save_mib": {k: v for k, v in result.phase_rss_mib.items() if k.endswith("final save")},
        "adapter_only_final": adapter_only,
        "final_bytes": sum(result.final_files.values()),
    }


def write_report(out: Path, dry_run: bool, device: str, results: list[Result]) -> str:
    """gpu_jobs.json and gpu_jobs.md, rewritten after every job so a stopped bench keeps what it measured."""
    rss = next((ram_check(r) for r in results if r.job.name.startswith("rss-")), None)
    report = {"dry_run": dry_run, "device": device, "results": [asdict(r) for r in results], "ram_check": rss}
    (out / "gpu_jobs.json").write_text(json.dumps(report, indent=2))
    text = table(results) + (f"\n\nitems 1-2 (FSDP2 LoRA, 2 CPU ranks): {json.dumps(rss)}" if rss else "")
    (out / "gpu_jobs.md").write_text(text + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, few steps: the same code paths")
    ap.add_argument("--work", type=Path, default=None, help="models and runs (default: OUT/work)")
    ap.add_argument("--steps-8b", type=int, default=50)
    ap.add_argument("--steps-1b", type=int, default=100)
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="start no job after this many seconds")
    ap.add_argument("--only", default="", help="run only jobs whose name contains this")
    args = ap.parse_args(argv)

    from tests.harness import tiny_assets

    out: Path = args.out
    work: Path = args.work or out / "work"
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    tiny = tiny_assets()
    peak: float | None = None
    attns = ["sdpa"]
    if args.dry_run:
        device, big_cfg, small_cfg = "cpu", DRY_BIG, DRY_SMALL
        steps_big, steps_small = 4, 4
    else:
        import torch

        if not torch.cuda.is_available():
            print("gpu_jobs: no CUDA device; use --dry-run on CPU", file=sys.stderr)
            return 3
        device, big_cfg, small_cfg = "cuda", LLAMA3_8B, LLAMA_1B
        steps_big, steps_small = args.steps_8b, args.steps_1b
        name = torch.cuda.get_device_name()
        peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
        if flash_attn_importable():
            attns.insert(0, "flash_attention_2")
        else:
            print("gpu_jobs: flash_attn does not import; sdpa only", file=sys.stderr)
    t0 = time.monotonic()
    models = {
        "big": build_model(work / "model-big", big_cfg, tiny / "model", device),
        "small": build_model(work / "model-small", small_cfg, tiny / "model", device),
    }
    data = write_dataset(
        work / "train.jsonl", rows=6000 if not args.dry_run else 400, mean_words=12 if args.dry_run else 400
    )
    print(f"gpu_jobs: models and data ready in {time.monotonic() - t0:.0f} s", flush=True)
    results: list[Result] = []
    for job in plan_jobs(args.dry_run, attns, steps_big, steps_small):
        if args.only and args.only not in job.name:
            continue
        if time.monotonic() - t0 > args.budget_s:
            print(f"gpu_jobs: {job.name} skipped, past the {args.budget_s:.0f} s budget", flush=True)
            continue
        r = run_job(job, models[job.model], data, work / "runs", peak)
        results.append(r)
        write_report(out, args.dry_run, device, results)
        summary = {
            "job": job.name, "exit": r.exit_code, "tokens_per_second": r.tokens_per_second, "mfu": r.mfu,
            "peak_gpu_bytes": r.peak_gpu_bytes, "estimate_bytes": r.estimate_bytes,
            "peak_rss_by_rank": r.peak_rss_by_rank, "seconds": round(r.seconds),
        }  # fmt: skip
        print(json.dumps(summary), flush=True)
    text = write_report(out, args.dry_run, device, results)
    print(text)
    return 0 if all(r.exit_code == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
