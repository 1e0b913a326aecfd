#!/usr/bin/env bash
# The wheel folder bench/gpu.sh carries to the lent GPU machine (`make gpu-wheels`): exactly what that
# machine lacks and the bench needs, as cp312 manylinux x86_64 builds, into .whl/ (ignored by git).
# That machine (/work/.library/device/KINDS.md) has Python 3.12, torch 2.11, transformers 5.17,
# accelerate 1.15, peft, huggingface_hub 1.33, pyarrow, pandas, xxhash, fsspec, httpx, pyyaml, jinja2,
# psutil, typing-extensions; it has no pydantic, pydantic-settings, trl, datasets (nor datasets' dill and
# multiprocess), and it reaches no registry. Versions are constraints.txt's, the ones ftq is tested with.
# The list is GPU_WHEELS below; bench/gpu_import_check.sh installs the same names for this machine's
# Python to check that every module the bench needs imports.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${DEST:-.whl}"
PY="${PY:-python3}"
# name==version, one per line: what the GPU machine lacks (pydantic's typing-extensions is there).
GPU_WHEELS=(
  pydantic==2.14.4
  pydantic_core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  pydantic-settings==2.16.3
  python-dotenv==1.2.4
  trl==1.16.0
  datasets==5.2.0
  dill==0.4.1
  multiprocess==0.70.19
)
if [[ "${1:-}" == --list ]]; then printf '%s\n' "${GPU_WHEELS[@]}"; exit 0; fi
rm -rf "$DEST"
mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "${GPU_WHEELS[@]}"
ls -1 "$DEST"
wheels=$(du -sb "$DEST" | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
total=$((wheels + tree))
echo "gpu-wheels: $DEST holds $((wheels / 1024)) KiB; with the tracked tree ($((tree / 1024)) KiB) $((total / 1048576)) MiB of the device tool's 64 MiB"
if (( total > 64 * 1048576 )); then
  echo "gpu-wheels: over the 64 MiB the device tool carries" >&2
  exit 1
fi
