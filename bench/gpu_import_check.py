"""Import every module bench/gpu.sh needs, as the lent GPU machine would (`make gpu-import-check`).

    python -m bench.gpu_import_check    # exit 0 when every module imports, else 1 naming each that fails
    python -m bench.gpu_import_check --device-versions   # also 1 unless Python, torch and transformers
                                                         # are the GPU machine's (DEVICE_VERSIONS)

What gpu.sh runs: `python -m bench.gpu_jobs` (and, with GPU_MICRO=1, bench.gpu_bench and bench.estimate_gpu),
which launches `accelerate launch -m trainer`. The modules are found by reading those files (an ast scan,
every `import` at any depth, so the trainer's lazy `from trl import SFTTrainer` counts) and following the
repository's own modules (ftq.*, trainer.*) they import, transitively. OPTIONAL are imported where present
and only reported otherwise: the bench and the trainer test for them (flash-attn, bitsandbytes) or never
reach them in a bench job (trackers, DeepSpeed).
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What gpu.sh runs (the trainer through accelerate's launcher).
ENTRY_FILES = (
    "bench/gpu_jobs.py",
    "bench/gpu_bench.py",
    "bench/estimate_gpu.py",
    "trainer/__main__.py",
    "trainer/tiny.py",
)
EXTRA = ("accelerate.commands.launch", "accelerate.commands.accelerate_cli")
OWN = ("bench", "ftq", "trainer")
OPTIONAL = frozenset({"flash_attn", "bitsandbytes", "deepspeed", "mlflow", "wandb", "liger_kernel"})
# The lent GPU machine's versions (/work/.library/device/KINDS.md: Python 3.12.3, torch 2.11.0+cu130,
# transformers 5.17.0): what the check must run with to say anything of that machine.
DEVICE_VERSIONS = {"python": "3.12", "torch": "2.11", "transformers": "5.17"}


def version_mismatches(found: dict[str, str]) -> list[str]:
    """Each of DEVICE_VERSIONS that `found` (name -> version, e.g. "2.11.0+cu130") does not match to its
    major.minor, as `name X, the GPU machine's Y`."""
    out = []
    for name, want in DEVICE_VERSIONS.items():
        have = found.get(name, "")
        if ".".join(have.split("+")[0].split(".")[:2]) != want:
            out.append(f"{name} {have or 'absent'}, the GPU machine's {want}")
    return out


def module_file(name: str) -> Path | None:
    """The repository file of one of its own modules, or None."""
    base = REPO.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, package: str) -> list[tuple[str, str | None]]:
    """(module, name) for each `import module` (name None) and `from module import name` in the file."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            if mod == "__future__":
                continue
            found.extend((mod, alias.name) for alias in node.names)
    return found


def required_imports() -> dict[str, set[str]]:
    """Every module the bench's files import, transitively through the repository's own, with the names
    taken from each (`from m import a` -> {"m": {"a"}})."""
    needed: dict[str, set[str]] = {m: set() for m in EXTRA}
    todo = [(f.removesuffix(".py").replace("/", "."), REPO / f) for f in ENTRY_FILES]
    seen: set[Path] = set()
    while todo:
        name, path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for mod, attr in _imports(path, package):
            needed.setdefault(mod, set())
            if attr is not None and attr != "*":
                needed[mod].add(attr)
            if mod.split(".")[0] in OWN:
                for candidate in (mod, f"{mod}.{attr}" if attr else None):
                    if candidate and (own := module_file(candidate)) is not None:
                        todo.append((candidate, own))
    return needed


def check() -> list[str]:
    """The failures, one line each (a required module or name that does not import)."""
    failures: list[str] = []
    for mod, names in sorted(required_imports().items()):
        optional = mod.split(".")[0] in OPTIONAL
        try:
            module = importlib.import_module(mod)
        except Exception as exc:  # any failure to import is what this reports
            line = f"{mod}: {type(exc).__name__}: {exc}"
            print(("optional, absent: " if optional else "FAIL ") + line)
            if not optional:
                failures.append(line)
            continue
        for attr in sorted(names):
            if hasattr(module, attr):
                continue
            try:
                importlib.import_module(f"{mod}.{attr}")
            except Exception as exc:
                line = f"from {mod} import {attr}: {type(exc).__name__}: {exc}"
                print(("optional, absent: " if optional else "FAIL ") + line)
                if not optional:
                    failures.append(line)
    return failures


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(REPO))
    import torch
    import transformers

    found = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    print(", ".join(f"{k} {v}" for k, v in found.items()))
    mismatches = version_mismatches(found)
    for line in mismatches:
        print(f"gpu-import-check: not the GPU machine's versions: {line}", file=sys.stderr)
    if mismatches and "--device-versions" in args:
        return 1
    failures = check()
    count = len(required_imports())
    if failures:
        print(f"gpu-import-check: {len(failures)} of {count} modules or names do not import", file=sys.stderr)
        return 1
    print(f"gpu-import-check: all {count} modules the GPU bench needs import")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
