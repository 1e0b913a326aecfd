"""Serving's rules: which model a name calls, for which owner, and whether the engine can serve it; and
the models an owner may use (`GET /v1/models`).

A name is one of three things (docs/openai.md, "Calling your fine-tuned model"):

- a catalog alias (`ftq-tiny-serve`): the base model itself;
- an `ft:` model of one of the caller's succeeded jobs: its `final/`. For a LoRA job that is an adapter,
  loaded into the engine of the job's base; for a full fine-tune, a whole model, served by an engine of its
  own as its base;
- a checkpoint's `ft:...:ckpt-step-<n>` model of such a job: `checkpoints/checkpoint-<n>/`, the same way
  (an adapter, or a whole model). A sharded checkpoint (FSDP, DeepSpeed) holds neither: it is refused.

Resolution reads the store through the owner filter (OpenAIRepository): another owner's model, like a
name of nothing, is a 404 that says the same. A model the engine cannot serve is a 400 `model_not_servable`
saying why (vLLM's CPU attention needs head_dim >= 32; the base is gone; a rank above the engine's)."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from ftq.contract import runs
from ftq.contract.openai import Model
from ftq.contract.spec import looks_local
from ftq.engine import VLLM_LORA_RANKS, EngineError, adapter_rank
from ftq.runtime.settings import Settings
from ftq.store.models import Job, OpenAIJob
from ftq.store.openai_repository import OpenAIRepository
from service.openai import ids
from service.openai.errors import OpenAIError, not_found
from service.openai.jobs import fine_tuned_model
from service.openai.models import base_name, catalog
from service.paths import PathRefused, resolve_local

# vLLM's CPU attention refuses smaller heads (the catalog's ftq-tiny has 16).
MIN_CPU_HEAD_DIM = 32
_CHECKPOINT = re.compile(r"^(?P<model>ft:.+):ckpt-step-(?P<step>[0-9]{1,12})$")
ADAPTER_CONFIG = "adapter_config.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass(frozen=True)
class Target:
    """What a name calls: the base model an engine serves, and the adapter on it (None: the base itself)."""

    name: str  # the name the caller used; the answer's `model`
    base: Path  # the folder the engine serves as its base model
    label: str  # the base as the caller may see it (an alias, or the name of a full fine-tune): never a path
    engine_name: str  # the base's `model` in the engine (the adapters have their own names)
    adapter: Path | None  # a LoRA adapter folder, or None to call the base
    max_model_len: int

    @property
    def key(self) -> str:
        """Which engine serves it, within one owner's: one per base folder."""
        return str(self.base)


def not_servable(message: str) -> OpenAIError:
    return OpenAIError(message, param="model", code="model_not_servable")


def no_such_model(name: str) -> Exception:
    return not_found(f"The model '{name}' does not exist or you do not have access to it", "model")


# Resolution ------------------------------------------------------------------------------------------------


def resolve(session: Session, owner: str, settings: Settings, name: str) -> Target:
    """The model `name` calls for `owner` (see the module's docstring)."""
    if name.startswith("ft:"):
        return _fine_tuned(OpenAIRepository(session, owner), settings, name)
    template = catalog(settings.openai_models).templates.get(name)
    if template is None:
        raise no_such_model(name)
    model = template.get("model") or {}
    base = _base_folder(settings, str(model.get("name_or_path")), model.get("revision"), name)
    return _target(settings, name, base, label=name, engine_name=name, adapter=None)


def _fine_tuned(repo: OpenAIRepository, settings: Settings, name: str) -> Target:
    checkpoint = _CHECKPOINT.match(name)
    model_name = checkpoint.group("model") if checkpoint else name
    native = ids.job_in("ftjob-" + model_name.rsplit(":", 1)[-1])
    found = repo.get(native) if native else None
    # A job that has not succeeded has no fine-tuned model yet (OpenAI's too), nor callable checkpoints.
    if found is None or fine_tuned_model(*found) != model_name:
        raise no_such_model(name)
    job, extra = found
    run_dir = runs.run_dir(settings.runs_dir, job.id)
    if checkpoint is None:
        folder, what = run_dir / runs.FINAL, "its final model"
    else:
        step = int(checkpoint.group("step"))
        found_folder = _checkpoints(run_dir).get(step)
        if found_folder is None:
            raise no_such_model(name)
        folder, what = found_folder, f"its checkpoint at step {step}"
    if not folder.is_dir():
        raise not_servable(f"{name} is no longer on this server ({what} was removed)")
    spec = job.spec or {}
    if spec.get("lora") is None:
        # A full fine-tune: the folder is a whole model, served by an engine of its own as its base.
        if not (folder / "config.json").is_file() or not runs.has_weights(folder):
            raise not_servable(
                f"{name} cannot be served: {what} holds no whole model (a sharded FSDP or DeepSpeed "
                "checkpoint); call the job's fine_tuned_model, or export the checkpoint"
            )
        if not any((folder / f).is_file() for f in _TOKENIZER_FILES):
            raise not_servable(f"{name} cannot be served: {what} holds no tokenizer")
        return _target(settings, name, folder, label=name, engine_name=name, adapter=None)
    if not (folder / ADAPTER_CONFIG).is_file():
        raise not_servable(
            f"{name} cannot be served: {what} holds no LoRA adapter (a sharded FSDP or DeepSpeed "
            "checkpoint); call the job's fine_tuned_model, or export the checkpoint"
        )
    _check_rank(settings, name, folder)
    model = spec.get("model") or {}
    label = base_name(_trained_from(job, extra))
    base = _base_folder(settings, str(model.get("name_or_path")), model.get("revision"), name)
    return _target(settings, name, base, label=label, engine_name=label, adapter=folder)


def _trained_from(job: Job, extra: OpenAIJob | None) -> str:
    """The model a job was created on: the /v1 request's alias, or the native spec's model."""
    return extra.model if extra is not None else str((job.spec.get("model") or {}).get("name_or_path"))


def _check_rank(settings: Settings, name: str, adapter: Path) -> None:
    try:
        rank = adapter_rank(adapter)
    except EngineError:
        raise not_servable(f"{name} cannot be served: its adapter_config.json cannot be read") from None
    limit = min(settings.serve_max_lora_rank, VLLM_LORA_RANKS[-1])
    if rank > limit:
        raise not_servable(
            f"{name} cannot be served: its LoRA rank is {rank}, above the engines' {limit} "
            "(FTQ_SERVE_MAX_LORA_RANK; vLLM serves up to 512)"
        )


def _base_folder(settings: Settings, name_or_path: str, revision: Any, called: str) -> Path:
    """The local folder of a base model: a local path (inside the allowed roots), or a hub id already in
    this server's Hugging Face cache (an engine downloads nothing)."""
    if looks_local(name_or_path):
        try:
            return Path(resolve_local(name_or_path, settings.allowed_roots))
        except PathRefused:
            raise not_servable(
                f"{called} cannot be served: its base model is no longer on this server"
            ) from None
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(name_or_path, revision=revision or None, local_files_only=True)
    except Exception:  # not in the cache (LocalEntryNotFoundError), or not a hub id at all
        raise not_servable(
            f"{called} cannot be served: its base model {name_or_path} is not in this server's Hugging Face "
            "cache (the engine downloads nothing); a fine-tuning job on it puts it there"
        ) from None
    return Path(path)


def _target(
    settings: Settings, name: str, base: Path, *, label: str, engine_name: str, adapter: Path | None
) -> Target:
    config = _model_config(str(base), _mtime(base / "config.json"))
    if config is None:
        raise not_servable(f"{name} cannot be served: its base model has no readable config.json")
    head_dim = config.get("head_dim") or _divide(config.get("hidden_size"), config.get("num_attention_heads"))
    if settings.serve_device == "cpu" and isinstance(head_dim, int) and head_dim < MIN_CPU_HEAD_DIM:
        raise not_servable(
            f"{name} cannot be served: its base model's attention heads have head_dim {head_dim}, and the "
            f"generation engine (vLLM on the CPU) needs head_dim >= {MIN_CPU_HEAD_DIM}. Fine-tune a model it "
            "can serve (the catalog's ftq-tiny-serve is the tiny one), or download the adapter"
        )
    positions = config.get("max_position_embeddings")
    length = settings.serve_max_model_len
    if isinstance(positions, int) and positions > 0:
        length = min(length, positions)
    return Target(name, base, label, engine_name, adapter, length)


def _divide(a: Any, b: Any) -> int | None:
    return a // b if isinstance(a, int) and isinstance(b, int) and b > 0 else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return -1.0


@functools.lru_cache(maxsize=256)
def _model_config(folder: str, mtime: float) -> dict[str, Any] | None:
    """A model folder's config.json (cached per folder and modification time); its text config for a model
    whose config nests one (`text_config`)."""
    if mtime < 0:
        return None
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


# The models an owner may use ----------------------------------------------------------------------------


def models(session: Session, owner: str, settings: Settings) -> list[Model]:
    """`GET /v1/models`: the catalog's aliases (to fine-tune, and to call where the engine can serve
    them), the owner's fine-tuned models (to call, and to fine-tune further), and their checkpoints'
    models that can be called. Never another owner's."""
    cat = catalog(settings.openai_models)
    out = [Model(id=alias, created=cat.created, owned_by="ftq") for alias in cat.templates]
    for job, extra in OpenAIRepository(session, owner).succeeded():
        name = fine_tuned_model(job, extra)
        if name is None:
            continue
        created = int((job.finished_at or job.created_at).timestamp())
        out.append(Model(id=name, created=created, owned_by=owner))
        out += _checkpoint_models(settings, job, name, owner)
    return out


def _checkpoint_models(settings: Settings, job: Job, name: str, owner: str) -> list[Model]:
    """The job's checkpoints that can be called: each holds an adapter (a LoRA job) or a whole model, on a
    base the engine can serve."""
    checkpoints = _checkpoints(runs.run_dir(settings.runs_dir, job.id))
    if not checkpoints:
        return []
    lora = (job.spec or {}).get("lora") is not None
    if lora and not _base_servable(settings, job):
        return []
    out = []
    for step, folder in sorted(checkpoints.items(), reverse=True):  # newest first, as a job's are listed
        if lora and not (folder / ADAPTER_CONFIG).is_file():
            continue
        whole = (folder / "config.json").is_file() and runs.has_weights(folder)
        if not lora and not (whole and _servable_folder(settings, folder)):
            continue
        created = int(_mtime(folder)) if _mtime(folder) >= 0 else int(job.created_at.timestamp())
        out.append(Model(id=f"{name}:ckpt-step-{step}", created=created, owned_by=owner))
    return out


def _checkpoints(run_dir: Path) -> dict[int, Path]:
    """A run's checkpoint folders by step (without reading them, as runs.list_checkpoints does to tell
    whether each can be resumed)."""
    root = run_dir / runs.CHECKPOINTS
    try:
        children = list(root.iterdir())
    except OSError:
        return {}
    out = {}
    for child in children:
        step = runs.checkpoint_step(child)
        if step is not None and child.is_dir():
            out[step] = child
    return out


def _base_servable(settings: Settings, job: Job) -> bool:
    model = (job.spec or {}).get("model") or {}
    name_or_path = str(model.get("name_or_path"))
    if not looks_local(name_or_path):
        try:
            folder = _base_folder(settings, name_or_path, model.get("revision"), name_or_path)
        except OpenAIError:
            return False
        return _servable_folder(settings, folder)
    return _servable_folder(settings, Path(name_or_path))


def _servable_folder(settings: Settings, folder: Path) -> bool:
    try:
        _target(settings, "", folder, label="", engine_name="", adapter=None)
    except OpenAIError:
        return False
    return True


def find_model(session: Session, owner: str, settings: Settings, name: str) -> Model:
    """`GET /v1/models/{model}`: one of `models`, or a 404."""
    for m in models(session, owner, settings):
        if m.id == name:
            return m
    raise no_such_model(name)
