"""The model catalog of the OpenAI-compatible API: which base models may be fine-tuned (an alias, and
the spec template a job on it starts from), and the names of this owner's fine-tuned models.

The catalog is the operator's YAML or JSON file (FTQ_OPENAI_MODELS):

    default: ftq-tiny            # the template for a `model` that is not an alias (a hub id or a path)
    models:
      ftq-tiny:
        model: {name_or_path: ./tiny/model}
        lora: {r: 8, alpha: 16, target_modules: [q_proj, k_proj, v_proj, o_proj]}
        distributed: {strategy: ddp}
        resources: {launcher: local, device: cpu, processes_per_node: 2}
        training: {learning_rate: 1.0e-3, max_seq_len: 128, mixed_precision: "no"}

Without the setting, the catalog holds the tiny example model as `ftq-tiny`, and as `ftq-tiny-serve` the
tiny model the generation engine can serve (examples/tiny/model-serve: head_dim 64, which vLLM's CPU
attention needs; ftq-tiny's is 16), on the same template."""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ftq.contract import specyaml
from ftq.contract.spec import looks_local

TINY_ALIAS = "ftq-tiny"
_DEFAULT_TEMPLATE: dict[str, Any] = {
    "model": {"name_or_path": "./tiny/model"},
    "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    "distributed": {"strategy": "ddp"},
    "resources": {"launcher": "local", "device": "cpu", "num_nodes": 1, "processes_per_node": 2},
    "training": {
        "learning_rate": 1.0e-3,
        "max_seq_len": 128,
        "mixed_precision": "no",
        "gradient_checkpointing": True,
    },
}
TINY_SERVE_ALIAS = "ftq-tiny-serve"
_SERVE_TEMPLATE: dict[str, Any] = {**_DEFAULT_TEMPLATE, "model": {"name_or_path": "./tiny/model-serve"}}
# A hub id `owner/name` (the spec's own check runs later, at planning).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class Catalog:
    templates: dict[str, dict[str, Any]]
    default: str
    created: int

    def template_for(self, model: str) -> dict[str, Any] | None:
        """The spec template a job on `model` starts from: the alias's, or for a hub id or a local path
        the default template with that model; None for a name that is neither."""
        if model in self.templates:
            return copy.deepcopy(self.templates[model])
        if _HUB_ID.match(model) or looks_local(model):
            template = copy.deepcopy(self.templates[self.default])
            template["model"] = {**template.get("model", {}), "name_or_path": model}
            return template
        return None


@functools.lru_cache(maxsize=4)
def _load(path: str, mtime: float) -> Catalog:
    text = Path(path).read_text()
    raw = specyaml.load(text) if not path.endswith(".json") else json.loads(text)
    if not isinstance(raw, dict) or not isinstance(raw.get("models"), dict) or not raw["models"]:
        raise ValueError(f"{path}: the catalog needs `models:` mapping each alias to a spec template")
    templates = {str(k): dict(v or {}) for k, v in raw["models"].items()}
    default = str(raw.get("default") or next(iter(templates)))
    if default not in templates:
        raise ValueError(f"{path}: default {default!r} is not one of the catalog's models")
    return Catalog(templates, default, int(mtime))


def catalog(setting: str) -> Catalog:
    if not setting:
        return Catalog({TINY_ALIAS: _DEFAULT_TEMPLATE, TINY_SERVE_ALIAS: _SERVE_TEMPLATE}, TINY_ALIAS, 0)
    path = Path(setting)
    return _load(str(path), path.stat().st_mtime)


def base_name(model: str) -> str:
    """The `<base>` of the `ft:` name of a model trained from `model`: a catalog alias or a hub id as it
    is; an `ft:` model's own base (a model trained further keeps its first base, as OpenAI names it); a
    local path's last component, so that a name never shows where the server keeps a model (a native
    job's spec holds the resolved, absolute path)."""
    if model.startswith("ft:"):
        parts = model[len("ft:") :].rsplit(":", 3)  # base, owner, suffix, job hex
        return base_name(parts[0]) if len(parts) == 4 else _LOCAL_NAME
    if looks_local(model) or "\\" in model:
        name = re.sub(r"[^A-Za-z0-9._\-]+", "-", PurePosixPath(model.replace("\\", "/")).name).strip(".-")
        return name or _LOCAL_NAME
    return model


_LOCAL_NAME = "model"


def fine_tuned_name(base: str, owner: str, suffix: str | None, job_hex: str) -> str:
    """OpenAI's `ft:<base>:<owner>:<suffix>:<id>` for the model a job made (`base`: see base_name)."""
    return f"ft:{base_name(base)}:{owner}:{suffix or ''}:{job_hex}"
