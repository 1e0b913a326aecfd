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

import json
import sys
from pathlib import Path

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
