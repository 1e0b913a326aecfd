#!/usr/bin/env bash
# `make gpu-import-check`: a clean venv on THIS machine holding only the GPU machine's packages at its
# versions (/work/.library/device/KINDS.md): Python 3.12 (PY; pyenv's 3.12 where `python3.12` is not on the
# PATH), torch 2.11.0 (PyPI's build: it imports without a GPU, its CUDA libraries come as wheels), transformers
# 5.17.0, accelerate 1.15.0, huggingface_hub 1.33.0, safetensors 0.8.0, tokenizers 0.23.2; the others it lists
# without a version at pip's choice; then the carried wheels themselves (.whl/, cp312, `make gpu-wheels`;
# else their names and versions from bench/gpu_wheels.sh --list), ftq installed with --no-deps; then
# bench/gpu_import_check.py --device-versions in it, which fails unless Python, torch and transformers are the
# GPU machine's. It downloads (torch 2.11's CUDA wheels: several GB): not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PY:-}" ]]; then
  PY=python3.12
  if ! command -v "$PY" > /dev/null 2>&1 || ! "$PY" -V > /dev/null 2>&1; then
    PY=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 2> /dev/null | tail -1)
  fi
fi
if [[ -z "$PY" ]] || ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
  echo "gpu-import-check: no Python 3.12 here (the GPU machine's); set PY=/path/to/python3.12" >&2
  exit 3
fi
VENV="${VENV:-build/gpu-check-venv}"
GPU_TORCH="${GPU_TORCH:-torch==2.11.0}"
# The GPU machine's own packages that the bench reaches (pinned where KINDS.md gives the version).
GPU_PINNED=(transformers==5.17.0 accelerate==1.15.0 huggingface_hub==1.33.0 safetensors==0.8.0 tokenizers==0.23.2)
GPU_UNPINNED=(peft numpy pyarrow pandas xxhash fsspec filelock pyyaml jinja2 psutil packaging tqdm requests
  httpx regex typing-extensions sentencepiece)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" "$GPU_TORCH"
"${pip[@]}" "${GPU_PINNED[@]}" "${GPU_UNPINNED[@]}"
if compgen -G ".whl/*.whl" > /dev/null; then
  carried=(.whl/*.whl)  # the very files bench/gpu.sh carries
else
  mapfile -t carried < <(bash bench/gpu_wheels.sh --list)
fi
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
"$VENV/bin/python" -m bench.gpu_import_check --device-versions
