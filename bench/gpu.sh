#!/usr/bin/env bash
# The GPU bench for a lent GPU machine (one H200: about 10 minutes). Real ftq jobs through the real
# trainer (bench/gpu_jobs.py): a Llama-3-8B-shaped model with LoRA and a ~1B model fully fine-tuned,
# with flash attention (when flash_attn imports) and sdpa, packed and padded: tokens/s, MFU and peak GPU
# memory next to ftq's estimate; then issue 14 items 1-2 at 8B scale (FSDP2 LoRA on two CPU ranks: peak
# host RSS per rank while loading, an adapter-only final save). Models are random, built from configs
# and saved in bf16 once under $OUT/work (no hub).
#
#   OUT=/tmp/gpu-out bash bench/gpu.sh [--steps-8b 50] [--steps-1b 100] [--budget-s 540] [--only NAME]
#   bash bench/gpu.sh --dry-run          # CPU, tiny shapes: the same code paths, anywhere
#
# Results: $OUT/gpu_jobs.json, $OUT/gpu_jobs.md (and printed), $OUT/nvidia-smi.txt.
# FLASH_ATTN_WHEEL=/path/to/flash_attn-*.whl installs that wheel first; otherwise flash-attn is used
# only if it already imports or pip finds a prebuilt wheel (never a source build): else sdpa alone.
# GPU_MICRO=1 also runs the older micro-benchmarks (bench.gpu_bench, bench.estimate_gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/out/gpu}"
mkdir -p "$OUT"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

dry_run=false
for arg in "$@"; do
  if [[ "$arg" == --dry-run ]]; then dry_run=true; fi
done

if [[ "$dry_run" == false ]]; then
  if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1; then
    echo "bench/gpu.sh: no GPU on this machine (nvidia-smi finds none); run it on a GPU machine, or with --dry-run. Nothing measured." >&2
    exit 3
  fi
  nvidia-smi > "$OUT/nvidia-smi.txt"
  if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
    echo "bench/gpu.sh: $PYTHON has no CUDA-enabled torch (torch.cuda.is_available() is False); install a CUDA build, e.g. pip install torch --index-url https://download.pytorch.org/whl/cu128" >&2
    exit 3
  fi
  flash_imports() {
    "$PYTHON" -c 'import flash_attn' > /dev/null 2>&1
  }
  if ! flash_imports; then
    if [[ -n "${FLASH_ATTN_WHEEL:-}" ]]; then
      "$PYTHON" -m pip install --no-deps "$FLASH_ATTN_WHEEL" || true
    else
      # A prebuilt wheel only: building flash-attn from source takes far longer than this bench.
      timeout 120 "$PYTHON" -m pip install --no-deps --only-binary=:all: --retries 0 --timeout 10 flash-attn \
        > "$OUT/flash-attn-install.txt" 2>&1 || true
    fi
    if flash_imports; then
      echo "bench/gpu.sh: flash-attn installed and imports" >&2
    else
      # An installed wheel that does not import (built for another torch or CUDA) would fail every
      # flash job: leave it out, as the trainer's `auto` does.
      echo "bench/gpu.sh: flash-attn does not import here; measuring sdpa only" >&2
    fi
  fi
fi

"$PYTHON" -m bench.gpu_jobs --out "$OUT" "$@"

if [[ "${GPU_MICRO:-0}" == 1 && "$dry_run" == false ]]; then
  "$PYTHON" -m bench.gpu_bench --out "$OUT"
  "$PYTHON" -m bench.estimate_gpu --steps 3 --json "$OUT/estimate_gpu.json" | tee "$OUT/estimate_gpu.txt"
fi
