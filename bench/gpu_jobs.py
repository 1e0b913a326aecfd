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
- peak host memory per rank: PSS (/proc/PID/smaps_rollup, so pages shared between ranks count once)
  and RSS (VmHWM), of every process of the launch, sampled from outside; and the trainer's own
  `peak RSS` lines for loading and the final save.

It runs on the GPU machine as it is (Python 3.12, torch, transformers, accelerate, peft) plus the wheels
`make gpu-wheels` carries (pydantic, pydantic-settings, trl, datasets, ...): it imports ftq's spec,
estimate and render modules, never the test harness (psycopg, httpx) nor the service. Work files (models,
runs: ~18 GB at 8B) go under /tmp (--work), never under OUT, which holds only the results. CPU jobs run
with CUDA_VISIBLE_DEVICES="" so they cannot touch the GPU. Every job's timeout is its share of the
540 s budget (the shares sum within it) and never more than what is left of it.

Jobs (`--dry-run` shrinks the models, the steps and the matrix; every step is still a real launch):

1. items 1-2 of issue 14 at 8B scale: a LoRA job of the Llama-3-8B-shaped model under FSDP2 on two CPU
   ranks (one GPU cannot hold two NCCL ranks) with `cpu_ram_efficient_loading`: rank 1's loading peak
   must be a small fraction of rank 0's, and `final/` must hold the adapter alone;
2. the 8B model with LoRA and a ~1B model fully fine-tuned, each with flash attention (when flash_attn
   imports) and sdpa, packed and padded: tokens/s, MFU and peak memory against the estimate;
3. QLoRA (4-bit nf4 base weights) of the 8B model when bitsandbytes imports (else a line saying skipped);
4. the ~1B model fully fine-tuned under FSDP2 on one CUDA process (world size 1): accelerate's real FSDP2
   prepare (fully_shard), its bf16 mixed-precision policy over float32 parameters, and the final save's
   full state dict gathered into a `final/` that loads (`fsdp` in the JSON: what train.log said of each).

A job stopped at its share of the budget keeps what it measured: the trainer's points up to then (tokens/s,
the steps done), the sampled peaks and the log lines. The estimate column is made for the card in the machine
(torch.cuda.get_device_properties: an H100's 80 GB, an H200's 141), host RAM for a CPU job.

Results: DIR/gpu_jobs.json and a printed table (also DIR/gpu_jobs.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
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

# No job starts after this many seconds, and none runs past it: the device runs a command 10 minutes.
BUDGET_S = 540.0
# Work files: models (~18 GB at 8B) and runs, on the machine's own disk, never under OUT.
WORK = Path("/tmp/ftq-gpu-bench")
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
    timeout_s: float = 60.0
    qlora: bool = False
    mixed_precision: str | None = None  # None: bf16 on cuda, no on cpu


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
    peak_pss_by_rank: dict[str, int] = field(default_factory=dict)
    phase_rss_mib: dict[str, int] = field(default_factory=dict)
    final_files: dict[str, int] = field(default_factory=dict)
    device_memory_bytes: int | None = None  # what the estimate was made for: the card's, or host RAM
    steps_done: int | None = None  # the last step the trainer logged (a job cut short: how far it got)
    fsdp: dict[str, str] = field(default_factory=dict)  # what train.log said of FSDP (FSDP_LINES)
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
            "mixed_precision": job.mixed_precision or ("bf16" if job.device == "cuda" else "no"),
        },
        "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"} if job.lora else None,
        "distributed": {"strategy": job.strategy},
        "resources": {"launcher": "local", "device": job.device, "processes_per_node": job.processes},
    }
    if job.strategy == "fsdp":
        body["distributed"]["fsdp"] = {"version": 2, "cpu_ram_efficient_loading": True}
    if job.qlora and body["lora"] is not None:
        body["lora"]["quantization"] = {
            "bits": 4,
            "type": "nf4",
            "double_quant": True,
            "compute_dtype": "bf16",
        }
    return JobSpec.model_validate(body)


def free_port() -> int:
    """A loopback TCP port nothing listens on (the harness's, without importing the harness)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tiny_model(work: Path) -> Path:
    """The tiny model's folder (its tokenizer is what the bench takes): examples/tiny/model when built
    (`make install`), else built by the real entry point under `work` (the GPU machine gets the tracked
    tree only, and examples/tiny is ignored)."""
    built = REPO / "examples" / "tiny" / "model"
    if (built / "tokenizer.json").is_file():
        return built
    out = work / "tiny"
    if not (out / "model" / "tokenizer.json").is_file():
        env = {**os.environ, "PYTHONPATH": _pythonpath()}
        subprocess.run(
            [sys.executable, "-m", "trainer.tiny", "--out", str(out)],
            cwd=REPO,
            env=env,
            check=True,
            timeout=120,
        )
    return out / "model"


def _pythonpath() -> str:
    """The repository first, then what the caller had (the carried wheels' /tmp/site on the GPU machine)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def job_env(job: Job) -> dict[str, str]:
    """The launch's environment: offline, the repository importable, and no GPU for a CPU job (its ranks
    would otherwise see the GPU, and accelerate or NCCL could pick it)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": _pythonpath()}
    if job.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


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


def pss_bytes(pid: int) -> int:
    """The process's proportional set size now (/proc/PID/smaps_rollup; 0 where it cannot be read)."""
    try:
        text = (Path("/proc") / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("Pss:")), 0)


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
        self.pss: dict[str, int] = {}
        self.gpu_baseline = gpu_used_bytes() if gpu else None
        self.gpu_peak: int | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for pid in descendants(self.root):
                rank, hwm = _rank_and_hwm(pid)
                if rank is not None:
                    self.rss[rank] = max(self.rss.get(rank, 0), hwm)
                    self.pss[rank] = max(self.pss.get(rank, 0), pss_bytes(pid))
            if self.gpu and (used := gpu_used_bytes()) is not None:
                self.gpu_peak = max(self.gpu_peak or 0, used - (self.gpu_baseline or 0))
            self.done.wait(self.every)


def card_memory_bytes(device: str) -> int:
    """The memory the estimate is made for: the CUDA card's own (an H100's 80 GB, an H200's 141), or for a
    CPU job the host's RAM."""
    if device == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def run_job(
    job: Job,
    model_dir: Path,
    data: Path,
    runs: Path,
    peak_tflops: float | None,
    device_memory_bytes: int | None = None,
) -> Result:
    spec = job_spec(job, model_dir, data)
    run_dir = runs / job.name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    config = json.loads((model_dir / "config.json").read_text())
    memory = device_memory_bytes or card_memory_bytes(job.device)
    est = estimate_memory(spec, config, device_memory_bytes=memory)
    plan = render_plan(
        spec, job_id=job.name, run_dir=run_dir, settings=Settings(python=sys.executable),
        main_process_port=free_port(),
    )  # fmt: skip
    (run_dir / "spec.json").write_text(spec.model_dump_json())
    (run_dir / "accelerate_config.yaml").write_text(plan.accelerate_config_yaml)
    env = job_env(job)
    result = Result(job=job, estimate_bytes=est.per_device_bytes, usable_bytes=est.usable_device_bytes)
    result.estimate_host_bytes = est.host_bytes_per_node
    result.device_memory_bytes = memory
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
    result.peak_pss_by_rank = dict(sorted(sampler.pss.items()))
    result.peak_gpu_bytes = sampler.gpu_peak
    return read_back(result, run_dir, config, data, model_dir, peak_tflops)


# What train.log says of FSDP: the launch's strategy line, the dtypes of the parameters once prepared, and on
# CPU the mixed-precision policy's compute dtype (trainer/train.py logs each).
FSDP_LINES = {
    "strategy": re.compile(r"strategy (fsdp \([^)]*\)[^\n]*)"),
    "sharded_parameters": re.compile(r"sharded parameters: ([^\n]+)"),
    "computes_in": re.compile(r"FSDP computes in ([^\n;]+)"),
}


def read_back(
    result: Result,
    run_dir: Path,
    config: dict[str, Any],
    data: Path,
    model_dir: Path,
    peak_tflops: float | None,
) -> Result:
    """What the run left behind, whether it ended, failed or was cut at its time share: the trainer's
    points so far (tokens/s, MFU, the last step), the log's peak-RSS and FSDP lines, final/'s files, and on
    a non-zero exit the log's last lines as the error."""
    log_file = run_dir / "train.log"
    text = log_file.read_text(errors="replace") if log_file.is_file() else ""
    for rank, phase, mib in PEAK_LINE.findall(text):
        result.phase_rss_mib[f"rank {rank} {phase}"] = int(mib)
    for key, pattern in FSDP_LINES.items():
        if found := pattern.search(text):
            result.fsdp[key] = found.group(1).strip()
    final = run_dir / "final"
    if final.is_dir():
        result.final_files = {p.name: p.stat().st_size for p in sorted(final.iterdir()) if p.is_file()}
    metrics = run_dir / "metrics.jsonl"
    result.steps_done = last_step(metrics)
    tps = tokens_per_second(metrics)
    result.tokens_per_second = tps
    if tps is not None and peak_tflops:
        result.mfu = (
            tps * flops_per_token(config, result.job, mean_doc_tokens(data, model_dir)) / (peak_tflops * 1e12)
        )
    if result.exit_code != 0:
        result.error = (result.error or "") + " | ".join(text.strip().splitlines()[-5:])[-800:]
    return result


def _points(metrics: Path) -> list[dict[str, Any]]:
    """The trainer's points; a line cut mid-write by a stopped job is skipped."""
    if not metrics.is_file():
        return []
    points = []
    for line in metrics.read_text(errors="replace").splitlines():
        try:
            points.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return points


def last_step(metrics: Path) -> int | None:
    steps = [int(p["step"]) for p in _points(metrics) if p.get("step") is not None]
    return max(steps) if steps else None


def tokens_per_second(metrics: Path) -> float | None:
    """The median of the trainer's own points after the first (which holds the warm-up)."""
    values = [p["tokens_per_second"] for p in _points(metrics) if p.get("tokens_per_second")]
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


# Seconds kept for building the models and the data before the first job (8B in bf16: ~16 GB to /tmp).
SETUP_S = 90.0


def plan_jobs(dry_run: bool, attns: list[str], steps_big: int, steps_small: int, qlora: bool) -> list[Job]:
    """Sized for one 10-minute command on an H200: the training matrix's headline pair first, then the 8B
    RAM check on two CPU ranks, QLoRA, and the other variants. `--dry-run` runs three of its kinds on CPU with
    the tiny shapes (sdpa only; QLoRA is cuda-only, so reported as skipped there too). The timeouts are
    shares: fit_timeouts scales them to sum within the budget."""
    device = "cpu" if dry_run else "cuda"
    seq = 128 if dry_run else 2048
    jobs: list[Job] = []
    for attn in attns:
        for packing in (True, False):
            kind = "packed" if packing else "padded"
            big = Job(f"8b-lora-{attn}-{kind}", "big", True, attn, packing, steps_big, seq, 2, device)
            small = Job(f"1b-full-{attn}-{kind}", "small", False, attn, packing, steps_small, seq, 4, device)
            big.timeout_s, small.timeout_s = 75, 50
            jobs += [big, small]
    rss = Job("rss-fsdp2-lora-8b", "big", True, "sdpa", True, 2 if dry_run else 1, 64, 1, "cpu", 2, "fsdp")
    rss.timeout_s = 120
    # FSDP2 on one CUDA process: accelerate's fully_shard prepare, its bf16 mixed-precision policy (bf16 on
    # the CPU of a dry run too) and the full final save, which the single-device jobs never reach.
    fsdp = Job("1b-fsdp2-full-ws1", "small", False, "sdpa", True, steps_small, seq, 4, device, 1, "fsdp")
    fsdp.mixed_precision, fsdp.timeout_s = "bf16", 50
    extra = [rss, fsdp]
    if qlora:
        q = Job("8b-qlora-sdpa-packed", "big", True, "sdpa", True, steps_big, seq, 2, device, qlora=True)
        q.timeout_s = 60
        extra.append(q)
    if dry_run:
        # The suite runs the dry mode: one launch of each kind (LoRA packed, full padded, the two-rank
        # RAM check) keeps it short and still crosses every code path of the matrix.
        return [jobs[0], rss, fsdp, jobs[3]]
    return [*jobs[:2], *extra, *jobs[2:]]


def fit_timeouts(jobs: list[Job], budget_s: float, setup_s: float = SETUP_S) -> list[Job]:
    """The jobs' timeouts scaled down (never up) so that they and the setup sum within `budget_s`."""
    room = max(budget_s - setup_s, 1.0)
    total = sum(j.timeout_s for j in jobs)
    scale = min(1.0, room / total) if total else 1.0
    for job in jobs:
        job.timeout_s = max(1.0, int(job.timeout_s * scale))
    return jobs


def bitsandbytes_importable() -> bool:
    import importlib

    try:
        importlib.import_module("bitsandbytes")
    except (ImportError, OSError, RuntimeError):
        return False
    return True


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
        "| job | exit | s | tokens/s | MFU | peak GPU GiB | estimate GiB (usable of card) "
        "| peak RSS GiB by rank | peak PSS GiB by rank | notes |"
    )
    lines = [head, "|" + " --- |" * 10]

    def gib(n: int | None) -> str:
        return f"{n / GiB:.1f}" if n is not None else "-"

    for r in results:
        rss = ", ".join(f"{rank}: {gib(b)}" for rank, b in r.peak_rss_by_rank.items()) or "-"
        pss = ", ".join(f"{rank}: {gib(b)}" for rank, b in r.peak_pss_by_rank.items()) or "-"
        notes = "; ".join(f"{k} +{v} MiB" for k, v in r.phase_rss_mib.items())
        if r.final_files:
            notes += ("; " if notes else "") + "final/: " + ", ".join(r.final_files)
        if r.fsdp.get("sharded_parameters"):
            notes += ("; " if notes else "") + "FSDP params: " + r.fsdp["sharded_parameters"]
        if r.exit_code != 0 and r.steps_done is not None:
            notes += ("; " if notes else "") + f"{r.steps_done}/{r.job.steps} steps before it ended"
        if r.error:
            notes += ("; " if notes else "") + r.error[:200]
        lines.append(
            f"| {r.job.name} | {r.exit_code} | {r.seconds:.0f} | "
            + (f"{r.tokens_per_second:.0f}" if r.tokens_per_second else "-")
            + f" | {f'{r.mfu:.1%}' if r.mfu is not None else '-'} | {gib(r.peak_gpu_bytes)} | "
            + f"{gib(r.estimate_bytes)} ({gib(r.usable_bytes)} of {gib(r.device_memory_bytes)}) | {rss} "
            + f"| {pss} | {notes} |"
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


def write_report(
    out: Path, dry_run: bool, device: str, results: list[Result], skipped: list[str] | None = None
) -> str:
    """gpu_jobs.json and gpu_jobs.md, rewritten after every job so a stopped bench keeps what it measured."""
    skipped = skipped or []
    rss = next((ram_check(r) for r in results if r.job.name.startswith("rss-")), None)
    report = {
        "dry_run": dry_run, "device": device, "results": [asdict(r) for r in results], "ram_check": rss,
        "skipped": skipped,
    }  # fmt: skip
    (out / "gpu_jobs.json").write_text(json.dumps(report, indent=2))
    text = table(results) + (f"\n\nitems 1-2 (FSDP2 LoRA, 2 CPU ranks): {json.dumps(rss)}" if rss else "")
    text += "".join(f"\nskipped: {line}" for line in skipped)
    (out / "gpu_jobs.md").write_text(text + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="results only: gpu_jobs.json and gpu_jobs.md")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, few steps: the same code paths")
    ap.add_argument("--work", type=Path, default=WORK, help=f"models and runs (default: {WORK})")
    ap.add_argument("--steps-8b", type=int, default=50)
    ap.add_argument("--steps-1b", type=int, default=100)
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="the whole bench ends within this")
    ap.add_argument("--only", default="", help="run only jobs whose name contains this")
    args = ap.parse_args(argv)

    t0 = time.monotonic()
    out: Path = args.out
    work: Path = args.work
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    tokenizer_from = tiny_model(work)
    peak: float | None = None
    attns = ["sdpa"]
    skipped: list[str] = []
    if args.dry_run:
        device, big_cfg, small_cfg = "cpu", DRY_BIG, DRY_SMALL
        steps_big, steps_small = 4, 4
        skipped.append("8b-qlora: QLoRA runs on cuda only (bitsandbytes 4-bit); a dry run is on CPU")
        qlora = False
    else:
        import torch

        if not torch.cuda.is_available():
            print("gpu_jobs: no CUDA device; use --dry-run on CPU", file=sys.stderr)
            return 3
        device, big_cfg, small_cfg = "cuda", LLAMA3_8B, LLAMA_1B
        steps_big, steps_small = args.steps_8b, args.steps_1b
        name = torch.cuda.get_device_name()
        memory = card_memory_bytes("cuda") / GiB
        print(f"gpu_jobs: {name}, {memory:.1f} GiB: the memory the estimates are made for", flush=True)
        peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
        if flash_attn_importable():
            attns.insert(0, "flash_attention_2")
        else:
            skipped.append("flash_attention_2: flash_attn does not import here; sdpa only")
        qlora = bitsandbytes_importable()
        if not qlora:
            skipped.append("8b-qlora: bitsandbytes does not import here; QLoRA not measured")
    for line in skipped:
        print(f"gpu_jobs: skipped {line}", file=sys.stderr, flush=True)
    jobs = [j for j in plan_jobs(args.dry_run, attns, steps_big, steps_small, qlora) if args.only in j.name]
    fit_timeouts(jobs, args.budget_s)
    models = {
        "big": build_model(work / "model-big", big_cfg, tokenizer_from, device),
        "small": build_model(work / "model-small", small_cfg, tokenizer_from, device),
    }
    data = write_dataset(
        work / "train.jsonl", rows=6000 if not args.dry_run else 400, mean_words=12 if args.dry_run else 400
    )
    print(f"gpu_jobs: models and data ready in {time.monotonic() - t0:.0f} s", flush=True)
    results: list[Result] = []
    for job in jobs:
        left = args.budget_s - (time.monotonic() - t0)
        if left < 10:
            skipped.append(f"{job.name}: past the {args.budget_s:.0f} s budget")
            print(f"gpu_jobs: {job.name} skipped, past the {args.budget_s:.0f} s budget", flush=True)
            continue
        job.timeout_s = min(job.timeout_s, left)
        r = run_job(job, models[job.model], data, work / "runs", peak, card_memory_bytes(job.device))
        results.append(r)
        write_report(out, args.dry_run, device, results, skipped)
        summary = {
            "job": job.name, "exit": r.exit_code, "tokens_per_second": r.tokens_per_second, "mfu": r.mfu,
            "peak_gpu_bytes": r.peak_gpu_bytes, "estimate_bytes": r.estimate_bytes,
            "peak_rss_by_rank": r.peak_rss_by_rank, "peak_pss_by_rank": r.peak_pss_by_rank,
            "seconds": round(r.seconds), "steps_done": r.steps_done, "fsdp": r.fsdp,
        }  # fmt: skip
        print(json.dumps(summary), flush=True)
    text = write_report(out, args.dry_run, device, results, skipped)
    print(text)
    return 0 if all(r.exit_code == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
