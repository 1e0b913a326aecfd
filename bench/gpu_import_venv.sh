#!/usr/bin/env bash
# `make gpu-import-check`: a clean venv on THIS machine (python3.11) holding only the GPU machine's
# packages, at its versions where pip has them for 3.11 (/work/.library/device/KINDS.md: transformers
# 5.17.0, accelerate 1.15.0, huggingface_hub 1.33.0, safetensors 0.8.0, tokenizers 0.23.2; the others it
# lists without a version, at pip's choice), plus the carried wheels' names and versions
# (bench/gpu_wheels.sh --list) for this Python, ftq installed with --no-deps; then
# bench/gpu_import_check.py in it. torch: the GPU machine's 2.11.0 is not installable here (no CPU build
# of it on this machine's wheel store or its index), so torch 2.13.0 (CPU) stands in (GPU_TORCH=...).
# It downloads: not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3.11}"
VENV="${VENV:-build/gpu-check-venv}"
GPU_TORCH="${GPU_TORCH:-torch==2.13.0}"
# The GPU machine's own packages that the bench reaches (pinned where KINDS.md gives the version).
GPU_PINNED=(transformers==5.17.0 accelerate==1.15.0 huggingface_hub==1.33.0 safetensors==0.8.0 tokenizers==0.23.2)
GPU_UNPINNED=(peft numpy pyarrow pandas xxhash fsspec filelock pyyaml jinja2 psutil packaging tqdm requests
  httpx regex typing-extensions sentencepiece)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" "$GPU_TORCH"
"${pip[@]}" "${GPU_PINNED[@]}" "${GPU_UNPINNED[@]}"
mapfile -t carried < <(bash bench/gpu_wheels.sh --list)
"${pip[@]}" --no-deps "${carried[@]}"
"${pip[@]}" --no-deps .
echo "gpu-import-check: the venv holds:"
"$VENV/bin/python" -m pip list --disable-pip-version-check --format=freeze \
  | grep -iE '^(torch|transformers|accelerate|huggingface.hub|peft|trl|datasets|pydantic|pydantic.settings|pydantic.core|numpy|pyarrow|safetensors|tokenizers|ftq)=='
echo "gpu-import-check: pip check (a version clash pip would refuse; the GPU machine installs with --no-deps):"
"$VENV/bin/python" -m pip check --disable-pip-version-check || true
if "$VENV/bin/python" -c 'import psycopg' 2> /dev/null; then
  echo "gpu-import-check: psycopg is in the venv: not the GPU machine's packages" >&2
  exit 1
fi
"$VENV/bin/python" -m bench.gpu_import_check
