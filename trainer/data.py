"""Datasets: load from the hub, a local folder or one file, pick the splits, hand them to TRL.

Which columns a job reads follows its method and data format (ftq.contract.spec.METHOD_FORMATS,
FORMAT_COLUMNS):
prompt/completion, preference (prompt/chosen/rejected) and unpaired preference (prompt/completion/label)
rows reach TRL with those columns only. For text and chat, what reaches TRL is a dataset with one
column: `text` (from `dataset.text_field`), to which TRL appends EOS and which the tokenizer encodes
with its special tokens (BOS), or `messages` (from `dataset.messages_field`), which TRL tokenizes once
with the chat template and nothing added: the template alone decides BOS and EOS, exactly as
`apply_chat_template` does at inference. Rendering chat to text here and letting TRL tokenize that again
would add a second BOS on Llama templates and an extra EOS on templates that end with a newline.

Eval split rule (documented choice): when `eval_split` is set but the loaded dataset has only one split
(a single .jsonl/.json/.parquet file always loads as one split), a deterministic hold-out is cut from
it instead: `HOLDOUT_FRACTION` of the rows, at least 1 and at most `HOLDOUT_MAX` rows, shuffled with
`training.seed`. A dataset with several splits that lacks the named one is an error that lists them.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftq.contract.spec import (
    FORMAT_COLUMNS,
    METHOD_FORMATS,
    DatasetSpec,
    auto_format,
    format_columns,
    looks_local,
)

from . import hub
from .errors import DatasetError

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict

log = logging.getLogger("trainer")

HOLDOUT_FRACTION = 0.05
HOLDOUT_MAX = 2000
TEXT_COLUMN = "text"
MESSAGES_COLUMN = "messages"  # the column TRL treats as a conversation
# GRPO's rows: the prompt, and every other field of the row as one JSON string, which trainer.rewards
# hands to the grader as `item` (TRL passes columns but `prompt` and `completion` to reward functions,
# so a row's `completion`, a reference answer, would be lost under its own name).
PROMPT_COLUMN = "prompt"
ITEM_COLUMN = "ftq_item"
# datasets' builder names for the file suffixes a spec may name.
_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


def training_chat_template(tokenizer: Any) -> str | None:
    """TRL's copy of the tokenizer's chat template with the assistant turns marked ({% generation %}),
    or None where TRL cannot rewrite it (it says so by raising one of these, a refusal, not a bug)."""
    from trl.chat_template_utils import get_training_chat_template

    try:
        patched: str | None = get_training_chat_template(tokenizer)
    except (ValueError, NotImplementedError, KeyError):
        return None
    return patched


@dataclass
class Splits:
    train: Dataset
    eval: Dataset | None
    format: str  # the data format (ftq.contract.spec.FORMAT_COLUMNS) the rows were read as
    eval_note: str  # where the eval rows came from, for the log


def load_splits(spec: DatasetSpec, seed: int, method: str = "sft") -> tuple[DatasetDict, Splits]:
    """Load the dataset and pick train and eval splits, still in their source columns."""
    if spec.name_or_path is None:
        # dataset.file_id: the worker writes the upload's path into the run's spec.json.
        raise DatasetError(
            f"dataset.file_id {spec.file_id} was not resolved to a path; submit the job through ftq"
        )
    dsd = load_raw(spec.name_or_path)
    if spec.train_split not in dsd:
        raise DatasetError(
            f"dataset {spec.name_or_path} has no split {spec.train_split!r} (splits: {', '.join(dsd)}); "
            "set dataset.train_split"
        )
    train = dsd[spec.train_split]
    if len(train) == 0:
        raise DatasetError(f"split {spec.train_split!r} of dataset {spec.name_or_path} is empty")
    fmt = detect_format(spec, list(train.column_names), method)

    eval_ds, note = None, "no eval split"
    if spec.eval_split is not None:
        if spec.eval_split in dsd and spec.eval_split != spec.train_split:
            eval_ds, note = dsd[spec.eval_split], f"split {spec.eval_split!r}"
        elif len(dsd) == 1:
            n_eval = min(HOLDOUT_MAX, max(1, int(len(train) * HOLDOUT_FRACTION)))
            if n_eval >= len(train):
                raise DatasetError(
                    f"dataset {spec.name_or_path} has {len(train)} rows: too few to hold out an eval split"
                )
            parts = train.train_test_split(test_size=n_eval, shuffle=True, seed=seed)
            train, eval_ds = parts["train"], parts["test"]
            note = f"{n_eval} rows held out of {spec.train_split!r} (seed {seed})"
        else:
            raise DatasetError(
                f"dataset {spec.name_or_path} has no split {spec.eval_split!r} (splits: {', '.join(dsd)}); "
                "set dataset.eval_split to one of them or to null"
            )
    return dsd, Splits(train=train, eval=eval_ds, format=fmt, eval_note=note)


def load_raw(name_or_path: str) -> DatasetDict:
    """A DatasetDict from a hub id, a save_to_disk folder, a folder of data files, or one data file.

    With HF_HUB_OFFLINE set (a run whose fetch step downloaded the dataset), a hub id is read from its
    snapshot folder in the Hub cache, so no rank asks the Hub anything."""
    import datasets
    import datasets.exceptions

    try:
        if looks_local(name_or_path):
            return _load_local(Path(name_or_path), name_or_path)
        if hub.offline():
            snapshot = _fetched_snapshot(name_or_path)
            if snapshot is not None:
                return _load_local(snapshot, name_or_path)
            return _offline_load(name_or_path)
        problem = hub.unreachable_reason(name_or_path, "dataset")
        if problem:
            raise DatasetError(problem)
        return _as_dict(datasets.load_dataset(name_or_path))
    except DatasetError:
        raise
    except (
        FileNotFoundError,
        ValueError,
        ConnectionError,
        OSError,
        datasets.exceptions.DatasetsError,
    ) as err:
        # DatasetNotFoundError is a FileNotFoundError; offline hub lookups end as ConnectionError/OSError.
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DatasetError(f"cannot load dataset {name_or_path}: {first}") from err


def _fetched_snapshot(repo: str) -> Path | None:
    """The folder of the hub dataset `repo` in the Hub cache (HF_HUB_CACHE), where the fetch step put it,
    found without the network; None when it is not there."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, repo_type="dataset", local_files_only=True))
    except LocalEntryNotFoundError:
        return None


def _offline_load(repo: str) -> DatasetDict:
    """A hub dataset that is not in the Hub cache, offline: what datasets' own cache holds (a dataset
    loaded before this run's fetch step existed), or a DatasetError saying how it gets there."""
    import datasets

    try:
        return _as_dict(datasets.load_dataset(repo))
    except Exception as err:
        raise DatasetError(
            f"dataset {repo} is not in the Hugging Face cache and HF_HUB_OFFLINE is set: the fetch step "
            "(python -m trainer.fetch) downloads it before the ranks start; run the job through ftq, or "
            "unset HF_HUB_OFFLINE"
        ) from err


def _load_local(path: Path, name_or_path: str) -> DatasetDict:
    """A DatasetDict from a save_to_disk folder, a folder of data files, or one data file."""
    import datasets

    if not path.exists():
        raise DatasetError(f"dataset path {name_or_path} does not exist")
    if path.is_file():
        builder = _BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise DatasetError(f"dataset file {name_or_path}: use .jsonl, .json, .parquet, .csv or .arrow")
        return _as_dict(datasets.load_dataset(builder, data_files={"train": str(path)}))
    if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
        return _as_dict(datasets.load_from_disk(str(path)))
    data_files = _split_files(path)
    if data_files:
        # One load per file: splits may differ in columns (datasets would insist they match).
        return datasets.DatasetDict(
            {
                split: datasets.load_dataset(_BUILDERS[f.suffix.lower()], data_files=str(f), split="train")
                for split, f in data_files.items()
            }
        )
    return _as_dict(datasets.load_dataset(str(path)))


def _split_files(folder: Path) -> dict[str, Path]:
    """`train.jsonl`, `eval.jsonl`, ... at the top of a folder: each file's stem names its split.

    datasets' own inference would file `eval.jsonl` under `test`; naming splits after files keeps
    `eval_split: eval` meaning what it says. Shard names (`train-00000-of-00002`) fall back to datasets.
    """
    files = [p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix.lower() in _BUILDERS]
    stems = [p.stem for p in files]
    if not files or len(set(stems)) != len(stems) or any("-of-" in s for s in stems):
        return {}
    return {p.stem: p for p in files}


def _as_dict(loaded: Any) -> DatasetDict:
    from datasets import Dataset, DatasetDict

    if isinstance(loaded, Dataset):
        return DatasetDict({"train": loaded})
    return loaded


def detect_format(spec: DatasetSpec, columns: list[str], method: str = "sft") -> str:
    """The data format the job trains on (ftq.contract.spec's table), checking that its columns are there."""
    fmt = str(spec.format)
    if fmt == "auto":
        fmt = auto_format(method, columns, spec.text_field, spec.messages_field)
    if fmt not in METHOD_FORMATS[method]:
        raise DatasetError(
            f"training.method {method} trains on {' or '.join(METHOD_FORMATS[method])} data, not {fmt}; "
            "set dataset.format"
        )
    missing = [c for c in format_columns(fmt, spec.text_field, spec.messages_field) if c not in columns]
    if not missing:
        return fmt
    if fmt in ("text", "messages"):
        what = "messages" if fmt == "messages" else "text"
        setting = "dataset.messages_field" if fmt == "messages" else "dataset.text_field"
        raise DatasetError(
            f"dataset {spec.name_or_path} has no {what} column {missing[0]!r} "
            f"(columns: {', '.join(columns)}); set {setting} (train.py flag --dataset_text_field) "
            "to one of them"
        )
    raise DatasetError(
        f"dataset {spec.name_or_path} has no column(s) {', '.join(missing)} (columns: {', '.join(columns)}), "
        f"which {fmt} data for training.method {method} needs"
    )


def trl_rows(
    ds: Dataset,
    spec: DatasetSpec,
    fmt: str,
    tokenizer: Any,
    *,
    loss_on: str = "all",
    model_name: str = "the model",
    tokenize: bool = False,
) -> Dataset:
    """The rows as TRL takes them: only the format's columns, under TRL's names (`text` or `messages` for
    SFT; prompt/completion; prompt/chosen/rejected; prompt/completion/label), without empty rows.

    OpenAI's chat rows (a `weight` on assistant turns, `tool_calls`, `tools`) are tokenized here, with
    their labels (-100 where no loss): weight-0 assistant turns carry none, nor what `loss_on` leaves out.
    `tokenize` does the same for any chat rows (an eval split labelled as its train split was). OpenAI's
    preference rows become conversational prompt/chosen/rejected."""
    if fmt in ("prompt_only", "openai_reinforcement"):
        return grpo_rows(ds, spec, fmt, tokenizer)
    if fmt in ("messages", "openai_preference") and not getattr(tokenizer, "chat_template", None):
        raise DatasetError(
            f"dataset {spec.name_or_path} holds messages but the tokenizer has no chat template; "
            "use a chat model's tokenizer or a text dataset"
        )
    if fmt == "openai_preference":
        ds = ds.map(_openai_preference_row, remove_columns=ds.column_names)
        fmt = "preference"
    if fmt == "messages":
        if tokenize or _openai_chat(ds, spec.messages_field):
            return openai_chat_rows(ds, spec, tokenizer, loss_on=loss_on, model_name=model_name)
        # Other columns stay behind: TRL would read `prompt`/`completion` or `tools` as instructions.
        out = _only_column(ds, spec.messages_field, MESSAGES_COLUMN)
        return out.filter(lambda row: isinstance(row[MESSAGES_COLUMN], list) and bool(row[MESSAGES_COLUMN]))
    if fmt == "text":
        out = _only_column(ds, spec.text_field, TEXT_COLUMN)
        # Rows with no text would be empty sequences: TRL cannot train on them.
        return out.filter(lambda row: isinstance(row[TEXT_COLUMN], str) and row[TEXT_COLUMN] != "")

    keep = list(FORMAT_COLUMNS[fmt])
    if fmt == "preference" and "prompt" in ds.column_names:
        keep.insert(0, "prompt")
    drop = [c for c in ds.column_names if c not in keep]
    out = ds.remove_columns(drop) if drop else ds
    conversational = [c for c in keep if c != "label" and _is_conversation(out[0][c])]
    if conversational and not getattr(tokenizer, "chat_template", None):
        raise DatasetError(
            f"dataset {spec.name_or_path} holds conversations in {', '.join(conversational)} but the "
            "tokenizer has no chat template; use a chat model's tokenizer or text columns"
        )
    if fmt == "unpaired_preference":
        labels = {type(v).__name__ for v in out["label"][:1000]}
        if labels - {"bool"}:
            raise DatasetError(
                f"dataset {spec.name_or_path}: column label must be true (desirable) or false (undesirable), "
                f"found {', '.join(sorted(labels))}"
            )
    texts = [c for c in keep if c != "label"]
    return out.filter(lambda row: all(_non_empty(row[c]) for c in texts))


def _is_conversation(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict)


def _non_empty(value: Any) -> bool:
    return (isinstance(value, str) and value != "") or (isinstance(value, list) and bool(value))


def _only_column(ds: Dataset, field: str, name: str) -> Dataset:
    drop = [c for c in ds.column_names if c != field]
    out = ds.remove_columns(drop) if drop else ds
    return out.rename_column(field, name) if field != name else out


# OpenAI's formats ---------------------------------------------------------------------------------------

# The chat template's mark of the assistant's tokens (apply_chat_template's return_assistant_tokens_mask).
MASK_COLUMN = "assistant_masks"
# A tokenized row's labels: the token where it carries loss, IGNORE_INDEX where not. TRL takes them as they
# are, and its trainer is told so (trainer.train.build_trainer: no assistant_only_loss on tokenized rows).
LABELS_COLUMN = "labels"
IGNORE_INDEX = -100


def _openai_chat(ds: Dataset, field: str) -> bool:
    """Rows in OpenAI's chat format beyond plain {role, content}: a `weight`, `tool_calls` or `tools`."""
    if "tools" in ds.column_names:
        return True
    inner = getattr(ds.features.get(field), "feature", None)
    if isinstance(inner, dict):
        return bool({"weight", "tool_calls"} & set(inner))
    return any(
        isinstance(m, dict) and ("weight" in m or "tool_calls" in m)
        for row in ds.select(range(min(len(ds), 100)))[field]
        for m in (row or [])
    )


def _text(content: Any) -> Any:
    """OpenAI's content parts ([{type: text, text}]) as one string; a string or None as it is."""
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return content


def hf_message(m: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat message as chat templates read one: no null fields (a loaded dataset gives every
    message every key any message has), content parts joined, tool call arguments as objects, no weight."""
    out: dict[str, Any] = {}
    for key, value in m.items():
        if value is None or key == "weight":
            continue
        if key == "content":
            value = _text(value)
        elif key == "tool_calls":
            value = [_hf_tool_call(c) for c in value]
        out[key] = value
    return out


def _hf_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    import json

    fn = dict(call.get("function") or {})
    args = fn.get("arguments")
    if isinstance(args, str):
        with contextlib.suppress(ValueError):
            fn["arguments"] = json.loads(args)
    out = {k: v for k, v in call.items() if v is not None and k != "function"}
    out["type"] = out.get("type") or "function"
    out["function"] = fn
    return out


def _tools(value: Any) -> list[dict[str, Any]] | None:
    import json

    if isinstance(value, str):
        value = json.loads(value) if value.strip() else None
    return value or None


def _mask_runs(mask: list[int]) -> list[tuple[int, int]]:
    """The [start, end) spans of consecutive 1s: one per assistant turn the template marked."""
    runs, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    return runs


def openai_chat_rows(
    ds: Dataset, spec: DatasetSpec, tokenizer: Any, *, loss_on: str, model_name: str
) -> Dataset:
    """Tokenize OpenAI chat rows with their labels (`input_ids`, `labels`: IGNORE_INDEX on the tokens that
    carry no loss): with loss_on assistant the assistant turns are learned, else every token; either way
    less the assistant turns with `weight: 0`, which stay in the row as context (OpenAI's semantics). A
    row with tool calls the model's chat template does not render is an error naming its line; a row left
    with nothing to learn (loss_on assistant, every answer weight 0) is dropped."""
    from trl.chat_template_utils import has_generation_markers

    template: str | None = tokenizer.chat_template
    if template is None or not has_generation_markers(template):
        # None: no turn can be told apart, fine unless a weight or loss_on asks for it
        template = training_chat_template(tokenizer)
    field = spec.messages_field

    def where(index: int) -> str:
        return f"dataset {spec.name_or_path} line {index + 1}"

    def tokenize(row: dict[str, Any], index: int) -> dict[str, Any]:
        source = [m for m in row[field] if isinstance(m, dict)]
        messages = [hf_message(m) for m in source]
        tools = _tools(row.get("tools"))
        calls = [c["function"]["name"] for m in messages for c in m.get("tool_calls", [])]
        if calls:
            rendered = tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, chat_template=template or tokenizer.chat_template
            )
            if not all(name in rendered for name in calls):
                raise DatasetError(
                    f"{where(index)}: the chat template of {model_name} cannot render tool_calls; use a "
                    "model whose chat template renders tool calls, or leave the tool calls out"
                )
        weights = [m.get("weight") for m in source if m.get("role") == "assistant"]
        out = tokenizer.apply_chat_template(
            messages,
            tools=tools,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=template is not None,
            chat_template=template or tokenizer.chat_template,
        )
        ids = list(out["input_ids"])
        if template is None:
            if loss_on == "assistant" or 0 in weights:
                raise DatasetError(
                    f"{where(index)}: a weight of 0 (or loss_on assistant) needs a chat template that marks "
                    f"the assistant turns ({{% generation %}}), and the one of {model_name} does not"
                )
            return {"input_ids": ids, LABELS_COLUMN: ids}
        marked = list(out[MASK_COLUMN])
        runs = _mask_runs(marked)
        if len(runs) != len(weights):
            raise DatasetError(
                f"{where(index)}: the chat template of {model_name} marks {len(runs)} assistant turn(s) of "
                f"{len(weights)}, so their weights cannot be applied"
            )
        mask = marked if loss_on == "assistant" else [1] * len(ids)
        for (start, end), weight in zip(runs, weights, strict=True):
            if weight == 0:
                mask[start:end] = [0] * (end - start)
        labels = [token if bit else IGNORE_INDEX for token, bit in zip(ids, mask, strict=True)]
        return {"input_ids": ids, LABELS_COLUMN: labels}

    out = ds.map(tokenize, with_indices=True, remove_columns=ds.column_names)
    kept = out.filter(lambda row: any(t != IGNORE_INDEX for t in row[LABELS_COLUMN]))
    zero = sum(
        1
        for row in ds[field]
        for m in row or []
        if isinstance(m, dict) and m.get("role") == "assistant" and m.get("weight") == 0
    )
    log.info(
        "OpenAI chat rows: %d assistant turn(s) with weight 0 left out of the loss; %d row(s) with nothing "
        "to learn dropped",
        zero,
        len(out) - len(kept),
    )
    return kept


def _openai_preference_row(row: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's {input: {messages}, preferred_output, non_preferred_output} as TRL's conversational
    prompt/chosen/rejected (role and text; the tools of `input` are not passed on)."""

    def turns(messages: Any) -> list[dict[str, str]]:
        return [
            {"role": str(m["role"]), "content": str(_text(m.get("content")) or "")}
            for m in messages or []
            if isinstance(m, dict)
        ]

    return {
        "prompt": turns((row.get("input") or {}).get("messages")),
        "chosen": turns(row.get("preferred_output")),
        "rejected": turns(row.get("non_preferred_output")),
    }


def grpo_rows(ds: Dataset, spec: DatasetSpec, fmt: str, tokenizer: Any) -> Dataset:
    """GRPO's rows: `prompt` (text, or a conversation the chat template renders with the generation
    prompt) and ITEM_COLUMN, the row's other fields for the grader. prompt_only rows take `prompt`;
    OpenAI's reinforcement rows take their `messages` (dataset.messages_field), which must end before the
    assistant's turn (rows that do not are dropped, and counted in the log)."""
    import json

    source = PROMPT_COLUMN if fmt == "prompt_only" else spec.messages_field

    def row(r: dict[str, Any]) -> dict[str, Any]:
        prompt = r[source]
        if isinstance(prompt, list):
            prompt = [hf_message(m) for m in prompt if isinstance(m, dict)]
        item = {k: v for k, v in r.items() if k != source}
        return {PROMPT_COLUMN: prompt, ITEM_COLUMN: json.dumps(item, default=str)}

    def usable(r: dict[str, Any]) -> bool:
        prompt = r[PROMPT_COLUMN]
        if isinstance(prompt, str):
            return prompt != ""
        return isinstance(prompt, list) and bool(prompt) and prompt[-1].get("role") != "assistant"

    out = ds.map(row, remove_columns=ds.column_names).filter(usable)
    if len(out) == 0:
        raise DatasetError(
            f"dataset {spec.name_or_path} has no prompt to train on: {fmt} rows need a non-empty "
            f"{source!r}" + (" that ends before the assistant's turn" if fmt != "prompt_only" else "")
        )
    if len(out) < len(ds):
        dropped = len(ds) - len(out)
        log.info("GRPO rows: %d of %d row(s) without a prompt to complete dropped", dropped, len(ds))
    if isinstance(out[0][PROMPT_COLUMN], list) and not getattr(tokenizer, "chat_template", None):
        raise DatasetError(
            f"dataset {spec.name_or_path} holds conversations as prompts but the tokenizer has no chat "
            "template; use a chat model's tokenizer or text prompts"
        )
    return out
