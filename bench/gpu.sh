#!/usr/bin/env bash
# The GPU bench for a lent GPU machine (one H200, one command of at most 10 minutes). Real ftq jobs
# through the real trainer (bench/gpu_jobs.py): a Llama-3-8B-shaped model with LoRA and a ~1B model fully
# fine-tuned, with sdpa (and flash attention when flash_attn imports), packed and padded: tokens/s, MFU
# and peak GPU memory next to ftq's estimate; QLoRA when bitsandbytes imports; then the 8B FSDP2 LoRA on
# two CPU ranks (CUDA_VISIBLE_DEVICES=""): peak PSS and RSS per rank, an adapter-only final save; the 1B
# model under FSDP2 on one CUDA process (prepare, bf16 policy, full final save). Estimates use the card's own
# memory; a job cut at its time share keeps what it logged. Models
# are random, built from configs and saved in bf16 once under /tmp/ftq-gpu-bench (no hub, never $OUT).
#
# On the device tool (docs/benchmarks.md): `make gpu-wheels` here first, then
#   run(command="bash bench/gpu.sh", carry=[".whl"], timeout_s=600)
# This script installs the carried wheels into /tmp/site itself (the device README's line) when
# pydantic does not import. Elsewhere:
#   OUT=/tmp/gpu-out bash bench/gpu.sh [--steps-8b 50] [--steps-1b 100] [--budget-s 540] [--only NAME]
#   bash bench/gpu.sh --dry              # (or GPU_BENCH_DRY=1) CPU, tiny shapes: the same steps, anywhere
#
# Results (only these) under $OUT (default bench/out/gpu): gpu_jobs.json, gpu_jobs.md (a summary table,
# also printed), nvidia-smi.txt. FLASH_ATTN_WHEEL=/path/to/flash_attn-*.whl installs that wheel first
# (the GPU machine reaches no registry, so nothing is downloaded). GPU_MICRO=1 also runs the older
# micro-benchmarks (bench.gpu_bench, bench.estimate_gpu) after the jobs, outside the 540 s budget.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/out/gpu}"
mkdir -p "$OUT"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

dry_run=false
[[ "${GPU_BENCH_DRY:-0}" == 1 ]] && dry_run=true
args=()
for arg in "$@"; do
  case "$arg" in
    --dry | --dry-run) dry_run=true ;;
    *) args+=("$arg") ;;
  esac
done
[[ "$dry_run" == true ]] && args+=(--dry-run)

# The carried wheels (make gpu-wheels): what the GPU machine lacks, installed outside its own packages.
if [[ -d .whl ]] && ! "$PYTHON" -c 'import pydantic, pydantic_settings, trl, datasets' > /dev/null 2>&1; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi

if [[ "$dry_run" == false ]]; then
  if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1; then
    echo "bench/gpu.sh: no GPU on this machine (nvidia-smi finds none); run it on a GPU machine, or with --dry. Nothing measured." >&2
    exit 3
  fi
  nvidia-smi > "$OUT/nvidia-smi.txt"
  if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
    echo "bench/gpu.sh: $PYTHON has no CUDA-enabled torch (torch.cuda.is_available() is False)" >&2
    exit 3
  fi
  if [[ -n "${FLASH_ATTN_WHEEL:-}" ]] && ! "$PYTHON" -c 'import flash_attn' > /dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --target /tmp/site "$FLASH_ATTN_WHEEL" || true
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi

# gpu_jobs ends its last job within --budget-s (540 s by default); this bound only catches a hang.
timeout -k 10 580 "$PYTHON" -m bench.gpu_jobs --out "$OUT" "${args[@]}"

if [[ "${GPU_MICRO:-0}" == 1 && "$dry_run" == false ]]; then
  "$PYTHON" -m bench.gpu_bench --out "$OUT"
  "$PYTHON" -m bench.estimate_gpu --steps 3 --json "$OUT/estimate_gpu.json" | tee "$OUT/estimate_gpu.txt"
fi
