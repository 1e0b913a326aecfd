"""bench/gpu.sh is ready for a GPU: the script parses, and its Python part runs end to end on CPU with
tiny shapes (`--dry-run`): real launches through the rendered accelerate command, metrics read back,
per-rank peak RSS sampled, an adapter-only final save seen under FSDP2, and FSDP2 on one process in bf16
with its full final save."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.harness import REPO

pytestmark = pytest.mark.slow


def test_gpu_sh_parses() -> None:
    subprocess.run(["bash", "-n", str(REPO / "bench" / "gpu.sh")], check=True)


def test_dry_run_measures_real_jobs(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    work = tmp_path / "work"  # the models and runs (default /tmp/ftq-gpu-bench): never under OUT
    proc = subprocess.run(
        ["bash", "bench/gpu.sh", "--dry", "--work", str(work)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu_jobs.json").read_text())
    by_name = {r["job"]["name"]: r for r in report["results"]}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu_jobs.json", "gpu_jobs.md"]
    assert (work / "model-big" / "config.json").is_file()
    lora = by_name["8b-lora-sdpa-packed"]
    assert lora["exit_code"] == 0 and lora["tokens_per_second"] > 0
    assert lora["estimate_bytes"] > 0 and lora["peak_rss_by_rank"]["0"] > 0
    assert lora["peak_pss_by_rank"]["0"] > 0
    full = by_name["1b-full-sdpa-padded"]
    assert full["exit_code"] == 0 and full["tokens_per_second"] > 0
    rss = by_name["rss-fsdp2-lora-8b"]
    assert set(rss["peak_rss_by_rank"]) == {"0", "1"} and set(rss["peak_pss_by_rank"]) == {"0", "1"}
    assert {"rank 0 loading", "rank 1 loading", "rank 0 final save"} <= set(rss["phase_rss_mib"])
    assert report["ram_check"]["adapter_only_final"] is True
    # FSDP2 on one process (CUDA on the GPU machine, the CPU here): fully_shard's prepare, the bf16
    # mixed-precision policy over float32 parameters, and a full final/ gathered from the sharded model.
    ws1 = by_name["1b-fsdp2-full-ws1"]
    assert ws1["exit_code"] == 0 and ws1["tokens_per_second"] > 0 and ws1["steps_done"] == 4
    assert ws1["fsdp"]["strategy"].startswith("fsdp (DistributedType.FSDP), 1 process(es)")
    assert ws1["fsdp"]["computes_in"].startswith("bfloat16")
    assert "trainable float32" in ws1["fsdp"]["sharded_parameters"]
    assert "model.safetensors" in ws1["final_files"] and "config.json" in ws1["final_files"]
    # The estimate was made for this machine's memory (host RAM for a CPU job), not an H200's.
    assert lora["device_memory_bytes"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert any("QLoRA" in line for line in report["skipped"])
    assert "| 8b-lora-sdpa-packed | 0 |" in (tmp_path / "out" / "gpu_jobs.md").read_text()
