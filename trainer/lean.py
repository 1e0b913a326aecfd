"""Start-up without the integrations a run does not use.

transformers, accelerate, TRL and PEFT import every optional package they find installed, whether the
run uses it or not: bitsandbytes (and through it torch's inductor), W&B, MLflow, DeepSpeed and SciPy
(transformers' object-detection losses import it with every model) cost a
rank about 2 s of CPU before its first step (6.6 -> 4.4 s for the tiny model's whole run on one process,
`python -m bench.run_all --only startup`), on every rank of every run, and on a GPU machine bitsandbytes
also loads its CUDA libraries. Marking a package as absent (None in sys.modules) makes their
`importlib.util.find_spec` checks say it is not installed, so none of them imports it.

Only what the spec cannot need is left out: bitsandbytes unless `lora.quantization` is set or the model
folder's config says its weights are quantized (a hub model: kept, its config is not read here),
DeepSpeed unless it is the strategy, W&B and MLflow unless `integrations` asks for them (never in a side
run: an export or an evaluation logs to no tracker), SciPy except in a side run (an evaluation's
lm-evaluation-harness metrics use scikit-learn and SciPy; a grader runs in a process of its own).

Nor is what DeepSpeed builds for inference: on a CPU it compiles a shared-memory all-reduce op with g++
when its process group starts (about 70 CPU-s, once per machine, and a run fails without a compiler),
which only DeepSpeed-Inference's tensor parallelism calls (`skip_inference_comm_op`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ftq.contract.spec import JobSpec, Strategy

# The packages a run may leave out, and the spec settings that need each.
OPTIONAL = ("bitsandbytes", "deepspeed", "wandb", "mlflow", "scipy")


def _model_is_quantized(name_or_path: str) -> bool:
    """True unless a local model folder's config.json says its weights are not quantized."""
    config = Path(name_or_path) / "config.json"
    try:
        return "quantization_config" in json.loads(config.read_text())
    except (OSError, ValueError):
        return True  # a hub id, or a config we cannot read: keep bitsandbytes importable


def unused(spec: JobSpec, *, side_run: bool = False) -> list[str]:
    """The OPTIONAL packages this spec's run cannot need (`side_run`: an export or an evaluation of the
    job, which logs to no tracker, not its training)."""
    trackers = not side_run
    needed = {
        "bitsandbytes": (spec.lora is not None and spec.lora.quantization is not None)
        or _model_is_quantized(spec.model.name_or_path),
        "deepspeed": spec.distributed.strategy == Strategy.deepspeed,
        "wandb": trackers and spec.integrations.wandb is not None,
        "mlflow": trackers and spec.integrations.mlflow is not None,
        "scipy": side_run,
    }
    return [name for name in OPTIONAL if not needed[name]]


def skip_unused_imports(spec: JobSpec, *, side_run: bool = False) -> list[str]:
    """Mark the packages this run cannot need as absent (before torch or transformers is imported);
    the names left out. A package already imported is left alone."""
    skipped = [name for name in unused(spec, side_run=side_run) if name not in sys.modules]
    for name in skipped:
        sys.modules[name] = None  # type: ignore[assignment]  # import's own "not installed" marker
    return skipped


def skip_inference_comm_op() -> None:
    """Keep DeepSpeed from building its shared-memory all-reduce op (`deepspeed_shm_comm`) when its
    process group starts on a CPU: only `inference_all_reduce` uses it, and training never calls that
    (its all-reduce falls back to torch.distributed's without the op). Call before the process group
    starts (before the training arguments), with DS_ACCELERATOR=cpu set."""
    import deepspeed.ops

    # The probe of every op's compatibility runs once and is cached in the module: an edit persists,
    # and deepspeed.comm.torch.build_shm_op reads it before it builds anything.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


# --- Scans that give the same answer at every start --------------------------------------------------
#
# Two more start-up costs repeat the same work on every rank of every run: TRL maps every import name
# to its distribution at import (`importlib.metadata.packages_distributions()` reads the file list of
# each installed distribution: ~0.35 CPU-s in a 230-package environment), and transformers builds its
# lazy import table by reading all ~2,600 files under `transformers/models` for their `__all__`, twice
# (`define_import_structure`: ~1 CPU-s). On a shared filesystem, where a venv usually lives on a
# cluster, each of those reads is a network round trip. Their answers change only when a package is
# installed or a file edited, so `cache_import_scans` keeps them in JSON files under
# ~/.cache/ftq/start-up (XDG_CACHE_HOME), keyed by what they read: the installed distributions'
# metadata folders and their modification times for the first, every scanned file's size and
# modification time for the second (~0.05 CPU-s to stat). JSON, not pickle: a cache file is data,
# never code. Any failure (an unwritable home, a transformers without that function) falls back to
# the scan itself.

_SCANS_VERSION = 1


def _scan_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ftq" / "start-up"


def _cached(kind: str, key: str, compute: Any, encode: Any, decode: Any) -> Any:
    """compute(), or its answer from an earlier start with the same key."""
    digest = hashlib.blake2b(f"{_SCANS_VERSION}\0{key}".encode(), digest_size=16).hexdigest()
    path = _scan_cache_dir() / f"{kind}-{digest}.json"
    try:
        return decode(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        pass
    answer = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{path.name}.{os.getpid()}")
        part.write_text(json.dumps(encode(answer)))
        os.replace(part, path)  # ranks that start together each write a whole file; the last one stays
    except (OSError, TypeError, ValueError):
        pass
    return answer


def _tree_fingerprint(folder: str) -> str:
    """Every .py file under `folder` (what transformers reads), with its size and modification time."""
    lines: list[str] = []
    stack = [folder]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        stack.append(entry.path)
                elif entry.name.endswith(".py"):
                    stat = entry.stat()
                    lines.append(f"{entry.path}\0{stat.st_size}\0{stat.st_mtime_ns}")
    return "\n".join(sorted(lines))


def _installed_distributions() -> list[str]:
    """Each distribution's metadata folder on the import path, with its modification time: what
    `packages_distributions()` reads changes only when one of them is installed or removed (a folder
    of the path itself, such as the working directory, changes all the time)."""
    found: list[str] = []
    for folder in sys.path:
        try:
            entries = os.scandir(folder or ".")
        except OSError:
            continue
        with entries:
            for entry in entries:
                if entry.name.endswith((".dist-info", ".egg-info")):
                    found.append(f"{entry.path}\0{entry.stat().st_mtime_ns}")
    return found


def _cached_packages_distributions(original: Any) -> Any:
    def packages_distributions() -> Any:
        key = "\n".join(_installed_distributions())
        return _cached(
            "distributions", key, original, lambda d: d, lambda d: {k: list(v) for k, v in d.items()}
        )

    packages_distributions.__wrapped__ = original  # type: ignore[attr-defined]
    return packages_distributions


def _cached_define_import_structure(original: Any, version: str) -> Any:
    def encode(structure: Any) -> Any:
        return [
            [sorted(backends), {m: sorted(names) for m, names in modules.items()}]
            for backends, modules in structure.items()
        ]

    def decode(data: Any) -> Any:
        return {
            frozenset(backends): {m: set(names) for m, names in modules.items()} for backends, modules in data
        }

    @functools.lru_cache  # as transformers' own: one object per argument, which its __init__ extends
    def define_import_structure(module_path: Any, prefix: str | None = None) -> Any:
        folder = str(module_path)
        if os.path.isfile(folder):
            folder = os.path.dirname(folder)
        try:
            key = f"{version}\0{folder}\0{prefix}\0{_tree_fingerprint(folder)}"
        except OSError:
            return original(module_path, prefix)
        return _cached("transformers", key, lambda: original(module_path, prefix), encode, decode)

    define_import_structure.__wrapped__ = original
    return define_import_structure


class _AfterImport:
    """A meta path finder that edits one module right after its code runs (before anything imports a
    name from it), then leaves sys.meta_path."""

    def __init__(self, name: str, edit: Any) -> None:
        self.name, self.edit = name, edit

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        import importlib.machinery

        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_code = loader.exec_module

        def exec_module(module: Any) -> None:
            run_code(module)
            # An optimisation: should the edit fail, the module works as it came, scans and all.
            with contextlib.suppress(Exception):
                self.edit(module)

        loader.exec_module = exec_module  # this loader object serves this one file
        return spec


def cache_import_scans() -> None:
    """Serve `packages_distributions()` and transformers' `define_import_structure` from a file (see
    above). Call before transformers or TRL is imported; once imported, they are left as they are."""
    import importlib.metadata

    if not hasattr(importlib.metadata.packages_distributions, "__wrapped__"):
        importlib.metadata.packages_distributions = _cached_packages_distributions(
            importlib.metadata.packages_distributions
        )
    name = "transformers.utils.import_utils"
    if name in sys.modules or any(isinstance(f, _AfterImport) for f in sys.meta_path):
        return
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return

    def edit(module: Any) -> None:
        original = getattr(module, "define_import_structure", None)
        if callable(original):
            module.define_import_structure = _cached_define_import_structure(original, version)

    sys.meta_path.insert(0, _AfterImport(name, edit))


# --- The collector during imports ---------------------------------------------------------------------


@contextlib.contextmanager
def imports_without_gc() -> Iterator[None]:
    """Import with the cyclic garbage collector off, then freeze what was imported.

    Importing torch, transformers, PEFT, TRL and datasets creates about 700,000 objects that live as
    long as the process, and the collector walks them again and again while they are created: about
    0.6 CPU-s of a rank's ~5 s of imports on the tiny model. Freezing them afterwards (gc.freeze)
    also keeps every later full collection from walking them. Only the imports and the process group's
    set-up run inside: the collector is back before a dataset is tokenized or a model loaded, where
    cyclic garbage could hold real memory (what it leaves frozen here is ~10 MiB)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


# --- A run's start ------------------------------------------------------------------------------------


@contextlib.contextmanager
def start_up(spec: JobSpec, *, side_run: bool = False) -> Iterator[list[str]]:
    """A run's process before and while it makes its heavy imports (enter before anything imports
    torch or transformers; leave before the dataset is tokenized and the model loaded): the packages the
    spec cannot need left out (yielded), the two scans served from their cache, the collector off."""
    with imports_without_gc():
        skipped = skip_unused_imports(spec, side_run=side_run)
        cache_import_scans()
        yield skipped
