"""The model card (`README.md`) every `final/` and every export carries: a pure function of the job's spec
and what its run measured, so a reviewer can read the golden files in tests/unit/golden/.

The trainer writes `final/README.md` at the final save (rank 0) and the facts it measured beside it in
the run directory (`ftq.contract.runs.CARD_FACTS`); an export renders the card again from the same facts, for
what it wrote (merged weights or an adapter, in its dtype). Nothing here reads a file or a clock.

The front matter is the Hugging Face Hub's model card metadata: `base_model` (only for a Hub id; a
local folder is named in the text, not as metadata the Hub would refuse), `library_name` (`peft` for an
adapter, `transformers` for a full model), `tags` and `pipeline_tag`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

# The spec's training fields shown as the card's hyperparameters, in this order (the ones a reader
# compares runs by); a field the spec does not have is left out.
HYPERPARAMETERS = (
    "learning_rate",
    "lr_scheduler_type",
    "warmup_ratio",
    "weight_decay",
    "max_steps",
    "num_train_epochs",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_seq_len",
    "packing",
    "gradient_checkpointing",
    "mixed_precision",
    "seed",
)


@dataclass
class RunFacts:
    """What the run measured, as the trainer saw it at the final save. JSON in
    `ftq.contract.runs.CARD_FACTS`."""

    job_id: str | None = None
    train_rows: int | None = None
    eval_rows: int | None = None
    steps: int | None = None
    train_loss: float | None = None
    eval_loss: float | None = None
    tokens: int | None = None
    wall_seconds: float | None = None
    device: str = "cpu"  # cuda | cpu
    devices: int = 1  # processes (one per GPU on cuda)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> RunFacts:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("card facts must be a JSON object")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass(frozen=True)
class ExportFacts:
    """What an export wrote: `merged` (the adapter folded into the base) or `adapter`, in `dtype`."""

    export_id: str
    kind: str  # merged | adapter
    dtype: str  # bf16 | fp16 | fp32
    checkpoint: str = "final"  # final, or the step of the checkpoint exported
    # What the evaluations of that checkpoint scored (`<suite>/score`, ...), and the metric that made it
    # the best one where it is.
    evaluation: dict[str, float] = field(default_factory=dict)
    best_by: str | None = None


def _is_hub_id(name: str) -> bool:
    return bool(name) and not name.startswith(("/", ".", "~")) and name.count("/") <= 1


def _number(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    total = round(seconds)
    h, rest = divmod(total, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"


def _compute(facts: RunFacts) -> str:
    if facts.wall_seconds is None:
        return "n/a"
    if facts.device != "cuda":
        return f"none: a CPU job ({facts.devices} process{'es' if facts.devices != 1 else ''})"
    hours = facts.devices * facts.wall_seconds / 3600
    return f"{hours:.2f} GPU hours ({facts.devices} GPU{'s' if facts.devices != 1 else ''} x wall time)"


def render_model_card(spec: dict[str, Any], facts: RunFacts, export: ExportFacts | None = None) -> str:
    """The README.md for `final/` (export None) or for an export of it. `spec` is the job's spec.json."""
    model = spec.get("model") or {}
    dataset = spec.get("dataset") or {}
    training = spec.get("training") or {}
    lora = spec.get("lora")
    base = str(model.get("name_or_path") or "")
    method = str(training.get("method") or "sft")
    adapter = lora is not None and (export is None or export.kind == "adapter")

    tags = ["ftq", method, "lora" if lora is not None else "full-fine-tune"]
    if export is not None and export.kind == "merged" and lora is not None:
        tags.append("merged")
    meta: dict[str, Any] = {}
    if _is_hub_id(base):
        meta["base_model"] = base
    meta["library_name"] = "peft" if adapter else "transformers"
    meta["pipeline_tag"] = "text-generation"
    meta["tags"] = tags
    front = yaml.safe_dump(meta, sort_keys=False, default_flow_style=False).rstrip("\n")

    title = spec.get("name") or base.rstrip("/").split("/")[-1] or "model"
    if lora is not None:
        how = (
            f"LoRA (r={lora.get('r')}, alpha={lora.get('alpha')}, dropout={lora.get('dropout')}, "
            f"target modules: {', '.join(lora.get('target_modules') or []) or 'the defaults'})"
        )
    else:
        how = "full fine-tuning"
    if export is None:
        what = "the LoRA adapter" if lora is not None else "the full fine-tuned model"
    elif export.kind == "merged" and lora is not None:
        what = f"the LoRA adapter merged into the base model's weights, saved in {export.dtype}"
    elif export.kind == "merged":
        what = f"the full fine-tuned model, saved in {export.dtype}"
    else:
        what = f"the LoRA adapter, saved in {export.dtype}"

    dataset_name = dataset.get("name_or_path") or dataset.get("file_id") or "n/a"
    rows = f"{facts.train_rows} training rows" if facts.train_rows is not None else "training rows: n/a"
    if facts.eval_rows is not None:
        rows += f", {facts.eval_rows} evaluation rows"

    lines = [
        "---",
        front,
        "---",
        "",
        f"# {title}",
        "",
        f"This folder holds {what}, trained by ftq with {method.upper()} from `{base}`.",
        "",
        "## Training",
        "",
        f"- Base model: `{base}`",
        f"- Method: {method.upper()}, {how}",
        f"- Dataset: `{dataset_name}` ({rows})",
        f"- Steps: {facts.steps if facts.steps is not None else 'n/a'}",
        f"- Tokens: {facts.tokens if facts.tokens is not None else 'n/a'}",
        f"- Final train loss: {_number(facts.train_loss)}",
        f"- Final eval loss: {_number(facts.eval_loss)}",
        f"- Wall time: {_duration(facts.wall_seconds)}",
        f"- Compute: {_compute(facts)}",
        f"- ftq job: `{facts.job_id or 'n/a'}`",
    ]
    if export is not None:
        lines.append(f"- ftq export: `{export.export_id}` ({export.kind}, {export.dtype})")
        if export.checkpoint != "final":
            best = f", the best by {export.best_by}" if export.best_by else ""
            lines.append(f"- Checkpoint: step {export.checkpoint}{best}")
    if export is not None and export.evaluation:
        lines += ["", "## Evaluation", "", "| metric | value |", "| --- | --- |"]
        lines += [f"| {name} | {_number(value)} |" for name, value in sorted(export.evaluation.items())]
    lines += ["", "## Hyperparameters", "", "| name | value |", "| --- | --- |"]
    for name in HYPERPARAMETERS:
        value = training.get(name)
        if value is not None:
            lines.append(f"| {name} | {json.dumps(value)} |")
    lines += ["", "## Use", "", "```python"]
    if adapter:
        lines += [
            "from peft import AutoPeftModelForCausalLM",
            "from transformers import AutoTokenizer",
            "",
            'model = AutoPeftModelForCausalLM.from_pretrained("path/to/this/folder")',
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        ]
    else:
        lines += [
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            'model = AutoModelForCausalLM.from_pretrained("path/to/this/folder")',
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        ]
    lines += ["```", ""]
    return "\n".join(lines)
