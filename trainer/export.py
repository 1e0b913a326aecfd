"""Export a finished job's `final/`: the LoRA adapter merged into its base model, or the adapter alone,
in a chosen dtype, with the tokenizer, a generation config and a model card.

The worker launches it as one process (launch.sh locally, job.sbatch on SLURM) in the export's own
folder of the run directory, from the request it wrote there:

    python -m trainer.export --request RUN_DIR/exports/<export id>/export.json

- `merged` of a LoRA job: load the base model in the dtype, apply `final/`'s adapter,
  `merge_and_unload()`, save safetensors shards of at most `max_shard_size`.
- `merged` of a full fine-tune: `final/` re-saved in the dtype.
- `adapter`: `final/`'s adapter tensors converted to the dtype, with its adapter_config.json.
Then, with `push_to_hub`, the folder is uploaded with the operator's token (`HF_TOKEN`, set by the worker
only for such an export); an unreachable Hub or a missing token fails in seconds, before the merge.

Errors a user can act on end as one `ftq-error: <code>: <message>` line and exit status 2, as the
trainer's do (trainer.errors); heavy libraries are imported inside the functions, so `--help` is instant.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftq.contract import runs
from ftq.contract.errors import ErrorCode
from ftq.contract.modelcard import ExportFacts, RunFacts, render_model_card
from ftq.contract.spec import JobSpec

from . import side_run
from .errors import FtqError, ModelError
from .hub import DEFAULT_ENDPOINT, PROBE_TIMEOUT_S

log = logging.getLogger("trainer.export")

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# What of final/ an adapter export takes along besides the adapter itself (tokenizer and chat template).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "added_tokens.json",
)
# What a Hub push uploads: the export, not its launch records.
PUSH_PATTERNS = ["*.safetensors", "*.json", "*.model", "*.txt", "*.jinja", runs.MODEL_CARD]
PUSH_EXCLUDE = [runs.EXPORT_REQUEST, runs.LAUNCH_RECORD, runs.CANCEL_RECORD, "launches.log"]


class HubError(FtqError):
    code: ErrorCode = ErrorCode.hub_error


@dataclass(frozen=True)
class HubTarget:
    """Where `push_to_hub` sends the export (validated by the API: `ftq.contract.schemas`)."""

    repo_id: str
    private: bool = True


@dataclass(frozen=True)
class ExportRequest:
    export_id: str
    job_id: str
    kind: str
    dtype: str
    max_shard_size: str
    push_to_hub: HubTarget | None
    run_dir: Path
    out_dir: Path
    trust_remote_code: bool = False
    # What is exported: final/ (None) or a checkpoint's folder; with that checkpoint's evaluation results.
    source: Path | None = None
    checkpoint: str = "final"
    evaluation: dict[str, float] | None = None
    best_by: str | None = None

    @classmethod
    def read(cls, path: Path) -> ExportRequest:
        data = json.loads(path.read_text())
        return cls(
            **side_run.request_fields(data),
            export_id=str(data["export_id"]),
            kind=str(data["kind"]),
            dtype=str(data["dtype"]),
            max_shard_size=str(data["max_shard_size"]),
            push_to_hub=(
                HubTarget(str(hub["repo_id"]), bool(hub.get("private", True)))
                if (hub := data.get("push_to_hub"))
                else None
            ),
            source=Path(data["source"]) if data.get("source") else None,
            checkpoint=str(data.get("checkpoint") or "final"),
            evaluation={str(k): float(v) for k, v in (data.get("evaluation") or {}).items()},
            best_by=data.get("best_by"),
        )


def main(argv: list[str] | None = None) -> None:
    side_run.main_of("trainer.export", __doc__ or "", runs.EXPORT_REQUEST, run, argv)


def run(request: Path) -> None:
    export(ExportRequest.read(request))


def export(req: ExportRequest) -> None:
    final = req.source or req.run_dir / runs.FINAL
    if not final.is_dir():
        raise ModelError(f"the job has no {final.name}/ folder to export (was it removed?)")
    spec_dict, spec = side_run.read_spec(req.run_dir, req.trust_remote_code, _first_line)
    is_lora = (final / "adapter_config.json").is_file()
    if req.kind == "adapter" and not is_lora:
        raise ModelError("the job is a full fine-tune: its final/ holds no LoRA adapter; export it as merged")
    token = None
    if req.push_to_hub:
        token = hub_token()
        check_hub(token)  # before the merge: an unreachable Hub costs seconds, not the whole export
    req.out_dir.mkdir(parents=True, exist_ok=True)

    if req.kind == "adapter":
        write_adapter(final, req)
    elif is_lora:
        write_merged_lora(spec, final, req)
    else:
        write_full(spec, final, req)
    write_card(spec_dict, req)
    log.info("export %s written to %s", req.export_id, req.out_dir)
    if req.push_to_hub is not None and token is not None:
        push(req, req.push_to_hub, token)


# The three kinds ---------------------------------------------------------------------------------------


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, DTYPES[name])


def write_merged_lora(spec: JobSpec, final: Path, req: ExportRequest) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    dtype = _torch_dtype(req.dtype)
    m = spec.model
    log.info("loading the base model %s in %s", m.name_or_path, req.dtype)
    try:
        base = AutoModelForCausalLM.from_pretrained(
            m.name_or_path, revision=m.revision, trust_remote_code=m.trust_remote_code, dtype=dtype
        )
    except (OSError, ValueError, ImportError) as err:
        raise ModelError(f"cannot load the base model {m.name_or_path}: {_first_line(err)}") from err
    log.info("applying the adapter in %s and merging it", final)
    model = PeftModel.from_pretrained(base, str(final)).merge_and_unload()
    _save_model(model, req)
    _save_tokenizer(final, spec, req)


def write_full(spec: JobSpec, final: Path, req: ExportRequest) -> None:
    from transformers import AutoModelForCausalLM

    log.info("loading the fine-tuned model in %s in %s", final, req.dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(final), dtype=_torch_dtype(req.dtype), trust_remote_code=spec.model.trust_remote_code
        )
    except (OSError, ValueError, ImportError) as err:
        raise ModelError(f"cannot load {runs.FINAL}/: {_first_line(err)}") from err
    _save_model(model, req)
    _save_tokenizer(final, spec, req)


def write_adapter(final: Path, req: ExportRequest) -> None:
    from safetensors.torch import load_file, save_file

    dtype = _torch_dtype(req.dtype)
    tensors = load_file(str(final / "adapter_model.safetensors"))
    converted = {k: (t.to(dtype) if t.is_floating_point() else t).contiguous() for k, t in tensors.items()}
    save_file(converted, str(req.out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(final / "adapter_config.json", req.out_dir / "adapter_config.json")
    for name in TOKENIZER_FILES:
        if (final / name).is_file():
            shutil.copyfile(final / name, req.out_dir / name)


def _save_model(model: Any, req: ExportRequest) -> None:
    from transformers import GenerationConfig

    # Training turns the KV cache off (gradient checkpointing); generation wants it back.
    model.config.use_cache = True
    if getattr(model, "generation_config", None) is None:
        model.generation_config = GenerationConfig.from_model_config(model.config)
    log.info("saving safetensors shards of at most %s to %s", req.max_shard_size, req.out_dir)
    model.save_pretrained(str(req.out_dir), max_shard_size=req.max_shard_size, safe_serialization=True)
    if not (req.out_dir / "generation_config.json").is_file():
        model.generation_config.save_pretrained(str(req.out_dir))


def _save_tokenizer(final: Path, spec: JobSpec, req: ExportRequest) -> None:
    from transformers import AutoTokenizer

    source = str(final) if (final / "tokenizer_config.json").is_file() else spec.model.name_or_path
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=spec.model.trust_remote_code)
    tokenizer.save_pretrained(str(req.out_dir))


def write_card(spec_dict: dict[str, Any], req: ExportRequest) -> None:
    try:
        facts = RunFacts.from_json((req.run_dir / runs.CARD_FACTS).read_text())
    except (OSError, ValueError, TypeError):
        facts = RunFacts(job_id=req.job_id)  # a run from before cards: what the request knows
    spec_json = JobSpec.model_validate(spec_dict).model_dump(mode="json")  # as the trainer's card reads it
    export = ExportFacts(
        req.export_id, req.kind, req.dtype, req.checkpoint, req.evaluation or {}, req.best_by
    )
    card = render_model_card(spec_json, facts, export)
    (req.out_dir / runs.MODEL_CARD).write_text(card)


# The Hub -----------------------------------------------------------------------------------------------


def hub_token() -> str:
    token = os.environ.get("HF_TOKEN", "").strip()
    if not token:
        raise HubError(
            "push_to_hub needs the operator's Hugging Face token and this export has none; set FTQ_HUB_TOKEN "
            "on the worker, or export without push_to_hub and download the export"
        )
    return token


def check_hub(token: str) -> None:
    """One short request to the Hub: an unreachable one is a clear error in seconds (see trainer.hub)."""
    endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    request = urllib.request.Request(  # noqa: S310 (the operator's endpoint)
        f"{endpoint}/api/whoami-v2", headers={"Authorization": f"Bearer {token}"}, method="GET"
    )
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S):  # noqa: S310
            return
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise HubError(
                f"the Hugging Face Hub at {endpoint} refused the operator's token (HTTP {exc.code}); "
                "check FTQ_HUB_TOKEN"
            ) from None
        return
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        raise HubError(
            f"cannot reach the Hugging Face Hub at {endpoint} ({why}) to push the export; fix the network or "
            "proxy (HF_ENDPOINT, HTTPS_PROXY), or export without push_to_hub and download it"
        ) from None


def push(req: ExportRequest, target: HubTarget, token: str) -> None:
    from huggingface_hub import HfApi

    repo_id, private = target.repo_id, target.private
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        api.upload_folder(
            repo_id=repo_id,
            folder_path=str(req.out_dir),
            allow_patterns=PUSH_PATTERNS,
            ignore_patterns=PUSH_EXCLUDE,
            commit_message=f"ftq export {req.export_id} of job {req.job_id}",
        )
    except Exception as exc:
        raise HubError(f"pushing the export to {repo_id} failed: {_first_line(exc)}") from exc
    log.info("pushed to https://huggingface.co/%s", repo_id)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


if __name__ == "__main__":
    main()
    # Written and pushed: skip interpreter teardown, where a C++ thread torch or tokenizers still holds
    # can abort the process after the work is done (as trainer.__main__ does).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
