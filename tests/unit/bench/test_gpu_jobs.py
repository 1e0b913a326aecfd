"""bench/gpu_jobs.py in process: the GPU bench's matrix, specs and arithmetic, checked without a GPU."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import REPO
from bench.gpu_import_check import DEVICE_VERSIONS, required_imports, version_mismatches
from bench.gpu_jobs import (
    BUDGET_S,
    LLAMA3_8B,
    LLAMA_1B,
    WORK,
    Job,
    Result,
    card_memory_bytes,
    fit_timeouts,
    flops_per_token,
    job_env,
    job_spec,
    plan_jobs,
    ram_check,
    read_back,
    table,
)
from ftq.planning.estimate import estimate_memory, parse_arch

H200 = 141 * 10**9
H100 = 80 * 2**30


def test_the_matrix_on_a_gpu_covers_both_models_attentions_and_batches() -> None:
    jobs = plan_jobs(False, ["flash_attention_2", "sdpa"], steps_big=50, steps_small=100, qlora=True)
    training = [j for j in jobs if j.device == "cuda" and not j.qlora]
    assert {(j.model, j.lora, j.attn, j.packing) for j in training} == {
        (model, model == "big", attn, packing)
        for model in ("big", "small")
        for attn in ("flash_attention_2", "sdpa")
        for packing in (True, False)
    }
    # Items 1-2 at 8B scale: FSDP2 over two ranks, RAM-efficient loading, LoRA.
    (rss,) = [j for j in jobs if j.name.startswith("rss-")]
    spec = job_spec(rss, Path("/m"), Path("/d.jsonl"))
    assert (rss.model, rss.processes, spec.distributed.strategy) == ("big", 2, "fsdp")
    assert spec.distributed.fsdp.cpu_ram_efficient_loading and spec.lora is not None
    # QLoRA (when bitsandbytes imports): the 8B LoRA job with 4-bit nf4 base weights.
    (qlora,) = [j for j in jobs if j.qlora]
    quant = job_spec(qlora, Path("/m"), Path("/d.jsonl")).lora.quantization  # type: ignore[union-attr]
    assert quant is not None and (quant.bits, quant.type, qlora.device) == (4, "nf4", "cuda")
    assert not any(j.qlora for j in plan_jobs(False, ["sdpa"], 50, 100, qlora=False))
    # The headline pair and the RAM check come first, before the variants a short budget may skip.
    assert [j.name for j in jobs[:3]] == [
        "8b-lora-flash_attention_2-packed",
        "1b-full-flash_attention_2-packed",
        rss.name,
    ]


@pytest.mark.parametrize(
    "job", plan_jobs(False, ["flash_attention_2", "sdpa"], 50, 100, qlora=True), ids=lambda j: j.name
)
@pytest.mark.parametrize("card", [H100, H200], ids=["h100", "h200"])
def test_every_gpu_job_is_a_valid_spec_that_the_estimate_says_fits_the_lent_cards(
    job: Job, card: int
) -> None:
    spec = job_spec(job, Path("/models/x"), Path("/data/train.jsonl"))
    if job.device != "cuda":
        return
    est = estimate_memory(spec, LLAMA3_8B if job.model == "big" else LLAMA_1B, device_memory_bytes=card)
    assert est.fits is True, (job.name, est.per_device_bytes)


def test_fsdp2_runs_on_one_cuda_process_in_bf16() -> None:
    """Issue 51 (10): FSDP2 on CUDA, world size 1: accelerate's fully_shard prepare, the bf16 mixed-precision
    policy and the full final save, in the GPU matrix and in the dry run (on CPU, bf16 too)."""
    for dry in (False, True):
        (fsdp,) = [j for j in plan_jobs(dry, ["sdpa"], 50, 100, qlora=False) if j.name == "1b-fsdp2-full-ws1"]
        spec = job_spec(fsdp, Path("/m"), Path("/d.jsonl"))
        assert (spec.distributed.strategy, spec.distributed.fsdp.version, spec.resources.world_size) == (
            "fsdp",
            2,
            1,
        )
        assert spec.lora is None and spec.training.mixed_precision == "bf16"
        assert fsdp.device == ("cpu" if dry else "cuda")


def test_the_estimate_is_made_for_the_cards_own_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 51 (10): not an H200's 141 GB on any card: torch's device properties (an H100: 80 GiB)."""
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=H100))
    assert card_memory_bytes("cuda") == H100
    assert card_memory_bytes("cpu") == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_a_job_cut_at_its_share_keeps_what_it_measured(tmp_path: Path) -> None:
    """Issue 51 (10): a job stopped at its time share (SIGKILL: exit -9) reports the trainer's points so far,
    the steps it did and the log's lines, not nothing; a point cut mid-write is skipped."""
    run = tmp_path / "run"
    run.mkdir()
    points = [
        {"step": s, "loss": 1.0, "tokens_per_second": tps} for s, tps in ((1, 100.0), (2, 900.0), (3, 1100.0))
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points) + '{"step": 4, "lo')
    (run / "train.log").write_text(
        "strategy fsdp (DistributedType.FSDP), 1 process(es), device cuda:0; eval: none\n"
        "sharded parameters: trainable float32 (1,000)\n"
        "FSDP computes in bfloat16 (its mixed-precision policy)\n"
    )
    job = Job("1b-fsdp2-full-ws1", "small", False, "sdpa", True, 100, 2048, 4, "cuda", 1, "fsdp")
    cut = Result(job=job, exit_code=-9, error="stopped after 30 s (its share of the bench's time)")
    read_back(cut, run, LLAMA_1B, tmp_path / "d.jsonl", tmp_path, peak_tflops=None)
    assert cut.tokens_per_second == 1000.0 and cut.steps_done == 3  # the median after the warm-up point
    assert cut.fsdp == {
        "strategy": "fsdp (DistributedType.FSDP), 1 process(es), device cuda:0; eval: none",
        "sharded_parameters": "trainable float32 (1,000)",
        "computes_in": "bfloat16 (its mixed-precision policy)",
    }
    assert cut.error is not None and cut.error.startswith("stopped after 30 s")
    text = table([cut])
    assert "| 1000 |" in text and "3/100 steps before it ended" in text


def test_flops_per_token_is_palms_accounting() -> None:
    arch = parse_arch(LLAMA3_8B)
    assert arch is not None
    n = arch.layers * arch.layer_params + arch.vocab * arch.hidden  # no embedding lookup, with the head
    assert n == pytest.approx(7.5e9, rel=0.01)
    attn = 12 * arch.layers * arch.hidden
    full = Job("f", "big", False, "sdpa", True, 1, 2048, 1)
    lora = Job("l", "big", True, "sdpa", True, 1, 2048, 1)
    flash = Job("p", "big", True, "flash_attention_2", True, 1, 2048, 1)
    assert flops_per_token(LLAMA3_8B, full, 300) == 6 * n + attn * 2048
    assert flops_per_token(LLAMA3_8B, lora, 300) == 4 * n + attn * 2048
    # Packed under flash attention, a token attends within its own document only.
    assert flops_per_token(LLAMA3_8B, flash, 300) == 4 * n + attn * 300


def test_ram_check_and_table_read_what_the_trainer_logged() -> None:
    job = Job("rss-x", "big", True, "sdpa", True, 1, 64, 1, "cpu", 2, "fsdp")
    good = Result(
        job=job,
        exit_code=0,
        phase_rss_mib={"rank 0 loading": 30000, "rank 1 loading": 900, "rank 0 final save": 12},
        final_files={"adapter_model.safetensors": 84_000_000, "adapter_config.json": 900},
        peak_rss_by_rank={"0": 40 * 2**30, "1": 20 * 2**30},
    )
    check = ram_check(good)
    assert check["rank1_under_a_fifth_of_rank0"] and check["adapter_only_final"]
    bad = Result(
        job=job,
        exit_code=0,
        phase_rss_mib={"rank 0 loading": 30000, "rank 1 loading": 29000},
        final_files={"model.safetensors": 16 * 10**9},
    )
    check = ram_check(bad)
    assert not check["rank1_under_a_fifth_of_rank0"] and not check["adapter_only_final"]
    text = table([good, bad])
    assert "rank 1 loading +900 MiB" in text and "0: 40.0, 1: 20.0" in text


@pytest.mark.parametrize("attns", [["sdpa"], ["flash_attention_2", "sdpa"]])
def test_the_timeouts_sum_within_the_budget_with_the_setup(attns: list[str]) -> None:
    """One device command runs 10 minutes at most: the jobs' bounds and the models' setup fit in 540 s."""
    jobs = fit_timeouts(plan_jobs(False, attns, 50, 100, qlora=True), BUDGET_S)
    assert sum(j.timeout_s for j in jobs) + 90 <= BUDGET_S <= 540
    assert all(j.timeout_s >= 30 for j in jobs)


def test_cpu_jobs_see_no_gpu_and_keep_the_carried_wheels_on_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    jobs = plan_jobs(False, ["sdpa"], 50, 100, qlora=False)
    (rss,) = [j for j in jobs if j.device == "cpu"]
    env = job_env(rss)
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["PYTHONPATH"].split(":") == [str(REPO), "/tmp/site"]
    assert env["HF_HUB_OFFLINE"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in job_env(jobs[0])  # a GPU job keeps the GPU
    # Work files (~18 GB at 8B) go to /tmp, not under the results folder the device tool sends back.
    assert WORK.parts[:2] == ("/", "tmp")


def _top_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module != "__future__":
            found.add(node.module or "")
    return found


def test_the_import_check_covers_what_the_gpu_bench_imports() -> None:
    """What gpu.sh runs imports only what the GPU machine has plus the carried wheels: never the test
    harness (psycopg, httpx) nor the service, and the import check covers every module it imports."""
    needed = required_imports()
    for path in ("bench/gpu_jobs.py", "trainer/train.py", "trainer/model.py", "trainer/data.py"):
        assert _top_imports(REPO / path) <= set(needed), path
    roots = {m.split(".")[0] for m in needed}
    assert {"trl", "datasets", "peft", "pydantic", "pydantic_settings", "torch", "transformers"} <= roots
    assert not roots & {"tests", "psycopg", "httpx", "sqlalchemy", "service", "worker", "celery", "fastapi"}


def test_the_import_check_names_versions_that_are_not_the_gpu_machines() -> None:
    """Issue 51 (10): the import check says (and with --device-versions fails) when it did not run with the
    GPU machine's Python 3.12, torch 2.11 and transformers 5.17; gpu_import_venv.sh builds that venv."""
    assert DEVICE_VERSIONS == {"python": "3.12", "torch": "2.11", "transformers": "5.17"}
    device = {"python": "3.12.3", "torch": "2.11.0+cu130", "transformers": "5.17.0"}
    assert version_mismatches(device) == []
    here = {"python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.24.0"}
    assert version_mismatches(here) == [
        "python 3.11.7, the GPU machine's 3.12",
        "torch 2.13.0+cpu, the GPU machine's 2.11",
        "transformers 5.24.0, the GPU machine's 5.17",
    ]
    script = (REPO / "bench" / "gpu_import_venv.sh").read_text()
    assert 'GPU_TORCH="${GPU_TORCH:-torch==2.11.0}"' in script and "transformers==5.17.0" in script
    assert "sys.version_info[:2] != (3, 12)" in script and "--device-versions" in script
