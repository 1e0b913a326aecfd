#!/usr/bin/env bash
# GPU benchmark for a lent GPU machine (e.g. one H200): tokens/s, MFU and peak memory of a ~1B Llama
# (random init from config, no download) with flash attention (when importable) against sdpa, and
# packed against padded batches. Results: $OUT/gpu_bench.json, $OUT/gpu_bench.md, $OUT/nvidia-smi.txt.
#
#   OUT=/tmp/gpu-out bash bench/gpu.sh [--seq-len 4096] [--steps 10]
#
# Needs a CUDA build of torch and transformers (PYTHON picks the interpreter; default: .venv's, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/out/gpu}"
mkdir -p "$OUT"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "bench/gpu.sh: no GPU on this machine (nvidia-smi finds none); run it on a GPU machine. Nothing measured." >&2
  exit 3
fi
nvidia-smi > "$OUT/nvidia-smi.txt"
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "bench/gpu.sh: $PYTHON has no CUDA-enabled torch (torch.cuda.is_available() is False); install a CUDA build, e.g. pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" >&2
  exit 3
fi
"$PYTHON" -m bench.gpu_bench --out "$OUT" "$@"
# Preflight accuracy (issue 9): the memory estimate against torch.cuda.max_memory_allocated.
"$PYTHON" -m bench.estimate_gpu --steps 3 --json "$OUT/estimate_gpu.json" | tee "$OUT/estimate_gpu.txt"
